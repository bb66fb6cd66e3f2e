"""One exchange as a typed outcome, and failover across a service's endpoint list.

`call()` sends one request to one URL. `Endpoints` holds a service's comma-separated URL list
(ARCHITECTURE decision 16) and moves to the next replica only when the outcome proves the call
changed nothing: no connection (connect refused or connect timeout: nothing was sent) or a 503
NOT_LEADER / OVERLOADED (the server did nothing). Any other outcome, including a read timeout
after sending, is returned to the caller as is: re-sending it elsewhere could do it twice.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from dlock.auth import authorization_header
from dlock.budgets import Budget
from dlock.client.errors import (
    DlockError,
    NotLeader,
    Overloaded,
    ServiceUnreachable,
    error_from_reply,
)
from dlock.http import ConnectionPool, Reply, TransportError, exchange, pool_for


def parse_endpoints(value: str | Sequence[str]) -> tuple[str, ...]:
    """`"http://a:1, http://b:2"` (or a list) → ("http://a:1", "http://b:2"); never empty."""
    raw = value.split(",") if isinstance(value, str) else list(value)
    urls = tuple(url.strip().rstrip("/") for url in raw if url and url.strip())
    if not urls:
        raise ValueError(f"no endpoint URL in {value!r}")
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"endpoint {url!r} must start with http:// or https://")
    return urls


def changed_nothing(exc: DlockError, *, after_send: bool = True) -> bool:
    """True when `exc` proves the server did not act, so another replica may be asked.

    `after_send=False` (rail submissions) admits only "nothing was sent": once the bytes left,
    the request is never presented again, whatever came back.
    """
    if isinstance(exc, ServiceUnreachable):
        return not exc.sent
    return after_send and isinstance(exc, (NotLeader, Overloaded)) and exc.status == 503


class Endpoints:
    """A service's replicas, in order; calls stick to the last one that answered.

    `pool_size`: keep at least that many idle keep-alive connections per replica (a caller with
    N threads in flight passes N, so no thread reconnects per call).
    """

    def __init__(self, urls: str | Sequence[str], *, pool_size: int | None = None) -> None:
        self.urls = parse_endpoints(urls)
        self.pools = [pool_for(url, size=pool_size) for url in self.urls]
        self._current = 0
        self._mutex = threading.Lock()

    def __repr__(self) -> str:
        return f"<Endpoints {','.join(self.urls)}>"

    @property
    def current(self) -> str:
        return self.urls[self._current]

    def _order(self) -> list[int]:
        start = self._current
        return [(start + i) % len(self.urls) for i in range(len(self.urls))]

    def _moved_past(self, index: int) -> None:
        with self._mutex:
            if self._current == index:
                self._current = (index + 1) % len(self.urls)

    def call(
        self, method: str, path: str, *, failover_after_send: bool = True, **kwargs: Any
    ) -> Reply:
        """`call()` on the current replica, then the next ones while nothing changed.

        Each replica is tried at most once per call; the last error is raised when all refused.
        Waiting (retryAfterMillis) is the caller's retry loop's job: the error carries it.
        """
        last: DlockError | None = None
        for index in self._order():
            try:
                reply = call(method, self.urls[index] + path, pool=self.pools[index], **kwargs)
            except DlockError as exc:
                if not changed_nothing(exc, after_send=failover_after_send):
                    raise
                last = exc
                self._moved_past(index)
                continue
            return reply
        assert last is not None
        raise last


def call(
    method: str,
    url: str,
    *,
    hop: Budget,
    owner_id: str | None = None,
    json_body: Any = None,
    params: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
    read_timeout_s: float | None = None,
    trace_id: str | None = None,
    pool: ConnectionPool | None = None,
) -> Reply:
    """One exchange; a non-2xx becomes its typed DlockError, no response ServiceUnreachable."""
    # The caller's credential (DLOCK_EXECUTOR_CREDENTIAL) unless the caller chose one: revoke
    # sends the operator's.
    headers = {**authorization_header("executor"), **(headers or {})}
    try:
        reply = exchange(
            method,
            url,
            hop=hop,
            owner_id=owner_id,
            json_body=json_body,
            params=params,
            headers=headers,
            read_timeout_s=read_timeout_s,
            trace_id=trace_id,
            pool=pool,
        )
    except TransportError as exc:
        raise ServiceUnreachable(str(exc), sent=exc.sent) from exc
    if not reply.ok:
        raise error_from_reply(reply)
    return reply
