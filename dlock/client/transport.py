"""One exchange as a typed outcome, and failover across a service's endpoint list.

`call()` sends one request to one URL. `Endpoints` holds a service's comma-separated URL list
(ARCHITECTURE decision 16) and moves to the next replica only when the outcome proves the call
changed nothing: no connection (connect refused or connect timeout: nothing was sent) or a 503
NOT_LEADER / OVERLOADED (the server did nothing). Any other outcome, including a read timeout
after sending, is returned to the caller as is: re-sending it elsewhere could do it twice.

Outlier ejection (decision 21): an endpoint whose call timed out, was refused, or answered
503/504 (its own or its proxy's) is demoted for new calls for a bounded, jittered, exponentially
growing period (`EJECT_BASE_S` doubling per consecutive failure up to `EJECT_MAX_S`); what moves
to another endpoint is the next call, never the same bytes. When the period is over, one call is
its trial (or, with `probe_path`, one GET of that path first — the rail proxy's, so a payout is
never the probe); success restores it, failure demotes it again for longer. With every endpoint
demoted a call still goes out, to the one that failed least recently.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
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
from dlock.logs import log_event
from dlock.metrics import client_endpoint_ejected

# The first demotion of an endpoint lasts about this long (jittered 0.5–1×), doubling per
# consecutive failure up to EJECT_MAX_S.
EJECT_BASE_S = 1.0
EJECT_MAX_S = 15.0
# A health probe (probe_path) gets this budget: a stalled endpoint costs the prober no more.
PROBE_BUDGET = Budget(0.3, 0.5, 0, "outlier probe: GET of a health path")


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


def unhealthy(exc: DlockError) -> bool:
    """Whether `exc` counts against the endpoint: no answer (refused, timed out, dropped) or a
    503/504 from it or its proxy (not leader, overloaded, upstream timeout, deadline)."""
    return isinstance(exc, ServiceUnreachable) or exc.status in (503, 504)


@dataclass
class _Health:
    failures: int = 0  # consecutive
    until: float = 0.0  # demoted for new calls until then (monotonic)
    failed_at: float = 0.0
    probing: bool = False  # a trial call is out: no other call goes there meanwhile

    def demoted(self, now: float) -> bool:
        return self.failures > 0 and (now < self.until or self.probing)


class Endpoints:
    """A service's replicas, in order; calls stick to the last one that answered, and skip one
    that failed while its demotion lasts.

    `pool_size`: keep at least that many idle keep-alive connections per replica (a caller with
    N threads in flight passes N, so no thread reconnects per call). `name`: the service, for
    the `client_endpoint_ejected_total{peer}` counter and the log lines. `probe_path`: a GET
    that proves a demoted endpoint answers again, sent before it gets real calls back.
    """

    def __init__(
        self,
        urls: str | Sequence[str],
        *,
        pool_size: int | None = None,
        name: str = "peer",
        probe_path: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        random_fn: Callable[[], float] = random.random,
    ) -> None:
        self.urls = parse_endpoints(urls)
        self.pools = [pool_for(url, size=pool_size) for url in self.urls]
        self.name = name
        self.probe_path = probe_path
        self.clock = clock
        self.random_fn = random_fn
        self.health = [_Health() for _ in self.urls]
        self._current = 0
        self._mutex = threading.Lock()

    def __repr__(self) -> str:
        return f"<Endpoints {','.join(self.urls)}>"

    @property
    def current(self) -> str:
        return self.urls[self._current]

    def demoted(self) -> list[str]:
        """The endpoints new calls avoid right now."""
        now = self.clock()
        with self._mutex:
            return [u for u, h in zip(self.urls, self.health, strict=True) if h.demoted(now)]

    def _plan(self) -> tuple[list[int], int | None]:
        """(the order this call tries endpoints in, the index it is the trial call of)."""
        now = self.clock()
        n = len(self.urls)
        with self._mutex:
            sticky = [(self._current + i) % n for i in range(n)]
            healthy = [i for i in sticky if self.health[i].failures == 0]
            due = [
                i
                for i in sticky
                if self.health[i].failures
                and not self.health[i].probing
                and now >= self.health[i].until
            ]
            resting = sorted(
                (i for i in sticky if i not in healthy and i not in due),
                key=lambda i: self.health[i].failed_at,
            )
            trial = due[0] if due else None
            if trial is not None:
                self.health[trial].probing = True
            return ([trial] if trial is not None else []) + healthy + due[1:] + resting, trial

    def _failed(self, index: int, exc: DlockError) -> None:
        now = self.clock()
        with self._mutex:
            h = self.health[index]
            h.probing = False
            h.failures += 1
            h.failed_at = now
            base = min(EJECT_MAX_S, EJECT_BASE_S * 2 ** (h.failures - 1))
            period = base * (0.5 + 0.5 * self.random_fn())
            h.until = now + period
            first = h.failures == 1
            if self._current == index:
                self._current = (index + 1) % len(self.urls)
        client_endpoint_ejected.labels(peer=self.name).inc()
        if first:  # one line per episode; the counter counts every demotion
            log_event(
                "client_endpoint_demoted",
                level=logging.WARNING,
                peer=self.name,
                endpoint=self.urls[index],
                periodSeconds=round(period, 3),
                error=str(exc),
            )

    def _answered(self, index: int) -> None:
        with self._mutex:
            h = self.health[index]
            was_down = h.failures > 0
            h.failures, h.until, h.probing = 0, 0.0, False
            self._current = index
        if was_down:
            log_event("client_endpoint_restored", peer=self.name, endpoint=self.urls[index])

    def _probe(self, index: int) -> bool:
        """The health GET of a due endpoint; False (and demoted again) when it does not answer."""
        assert self.probe_path is not None
        try:
            call(
                "GET", self.urls[index] + self.probe_path, hop=PROBE_BUDGET, pool=self.pools[index]
            )
        except DlockError as exc:
            self._failed(index, exc)
            return False
        return True

    def call(
        self, method: str, path: str, *, failover_after_send: bool = True, **kwargs: Any
    ) -> Reply:
        """`call()` on the best endpoint, then the next ones while nothing changed.

        Each replica is tried at most once per call; the last error is raised when all refused.
        Waiting (retryAfterMillis) is the caller's retry loop's job: the error carries it.
        """
        order, trial = self._plan()
        last: DlockError | None = None
        try:
            for index in order:
                if index == trial and self.probe_path is not None and not self._probe(index):
                    continue
                try:
                    reply = call(method, self.urls[index] + path, pool=self.pools[index], **kwargs)
                except DlockError as exc:
                    if unhealthy(exc):
                        self._failed(index, exc)
                    else:
                        self._answered(index)  # it answered: a 409 comes from a healthy replica
                    exc.peer = self.name
                    if not changed_nothing(exc, after_send=failover_after_send):
                        raise
                    last = exc
                    continue
                self._answered(index)
                return reply
        finally:
            if trial is not None:
                with self._mutex:
                    self.health[trial].probing = False  # whatever ended the trial
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
