"""A thin etcd v3 client over the JSON gRPC gateway (`/v3/...`) on dlock's urllib3 pools: unary
calls through `dlock.http.exchange`, watch streams through `dlock.http_stream.open_stream`.

Why not etcd3gw (fine for plain CRUD): the lock backend needs (1) a short connect and
read timeout on every call so an unreachable or leaderless member answers NOT_LEADER within
about a second instead of hanging (etcd3gw has one global timeout and none at all on watches),
(2) a watch over several keys that ends at a caller's deadline and is closed cleanly (etcd3gw
watches run on a private thread pool with no deadline and are stopped by closing a raw socket
fd), and (3) the gRPC status of a failed call kept (`code`, e.g. 14 UNAVAILABLE, "no leader"),
which etcd3gw folds into a few exception classes. Transactions are raw JSON either way.

Unary calls (range, txn, leases, status) go through `dlock.http`, as every dlock hop does
(CHANGELOG row 66): no retry inside the library, one deadline for the whole answer, and its
`sent` verdict, which decides whether a call may move on to the next member (requests cost
more than twice the CPU per call: CHANGELOG row 77). A watch is a stream on a new connection
made by the member's pool (the same TLS settings), closed on every exit, which cancels its
watchers; it moves to the next member while the connect fails, as a call does.

Int64 fields arrive as JSON strings; keys and values travel base64-encoded (the request and
answer shapes: `lockserver.etcd_ops`, re-exported here).
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Iterator
from typing import Any

import orjson

from dlock.budgets import Budget
from dlock.http import TransportError, exchange, pool_for
from dlock.http_stream import Stream, open_stream
from lockserver.etcd_ops import (
    KeyValue,
    RangeResult,
    TxnResult,
    _b64,
    _kv,
    _range_result,
    compare,
    delete,
    get,
    prefix_end,
    put,
)

__all__ = [
    "EtcdClient",
    "EtcdError",
    "EtcdUnavailable",
    "KeyValue",
    "RangeResult",
    "TxnResult",
    "compare",
    "delete",
    "get",
    "prefix_end",
    "put",
    "request_deadline",
]

_WATCH_HEADERS = {"Content-Type": "application/json"}
# gRPC status codes that mean "this member cannot serve now": DEADLINE_EXCEEDED, UNAVAILABLE.
_UNAVAILABLE_GRPC = {4, 14}
_UNAVAILABLE_TEXT = (
    "no leader",
    "timed out",
    "deadline exceeded",
    "leader changed",
    "not capable",
    "stopped",
)


class EtcdError(Exception):
    """etcd answered with an error that is not about availability (a bug or a bad request)."""

    def __init__(self, message: str, grpc_code: int | None = None) -> None:
        super().__init__(message)
        self.grpc_code = grpc_code


class EtcdUnavailable(EtcdError):
    """Unreachable, timed out, or the member has no leader: nothing can be decided here now."""


# The deadline of the lock-server request being served (monotonic seconds), set once per request
# by `request_deadline`: every etcd call the request makes ends by it, so the sum of a request's
# calls (an acquire makes several) stays inside one hop budget and the client hears 503
# NOT_LEADER before its own read timeout, not a ReadTimeout it cannot tell from a lost reply.
_REQUEST_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "etcd_request_deadline", default=None
)


@contextlib.contextmanager
def request_deadline(seconds: float) -> Iterator[None]:
    """Bound every etcd call made inside to end within `seconds` from now (the outermost
    deadline wins: a store call made by another one keeps its caller's)."""
    if _REQUEST_DEADLINE.get() is not None:
        yield
        return
    token = _REQUEST_DEADLINE.set(time.monotonic() + seconds)
    try:
        yield
    finally:
        _REQUEST_DEADLINE.reset(token)


class _Refused(Exception):
    """A member provably did nothing with the call: safe to send it to another member."""

    def __init__(self, unavailable: EtcdUnavailable) -> None:
        super().__init__(str(unavailable))
        self.unavailable = unavailable


class EtcdClient:
    """Thread-safe: the process's keep-alive pool per member (`dlock.http.pool_for`), shared by
    the lock-server's threads, for calls and watches alike. An https:// member is verified
    against DLOCK_CA_BUNDLE, as every dlock client verifies its peer (else the system store),
    and is shown DLOCK_CLIENT_CERT/DLOCK_CLIENT_KEY when set (etcd's --client-cert-auth)."""

    def __init__(
        self,
        url: str,
        *,
        connect_timeout: float = 0.5,
        read_timeout: float = 2.0,
        pool_size: int = 64,
    ) -> None:
        # ETCD_URL is a comma-separated list of members (ARCHITECTURE decision 16)
        self.urls = [part.strip().rstrip("/") for part in url.split(",") if part.strip()]
        if not self.urls or not all(u.startswith(("http://", "https://")) for u in self.urls):
            raise ValueError(f"ETCD_URL must be http(s) URLs separated by commas, got {url!r}")
        self._member = 0
        self.timeout = (connect_timeout, read_timeout)
        self.pools = {member: pool_for(member, size=pool_size) for member in self.urls}

    def close(self) -> None:
        """Close the idle connections to every member."""
        for pool in self.pools.values():
            pool.close()

    @property
    def url(self) -> str:
        """The member calls go to now; moves on when one refuses or times out."""
        return self.urls[self._member % len(self.urls)]

    def _next_member(self, failed: str) -> None:
        if self.url == failed:  # another thread may have moved on already
            self._member = (self._member + 1) % len(self.urls)

    # -- transport

    def _post(
        self, path: str, body: dict[str, Any], timeout: float | None = None
    ) -> dict[str, Any]:
        """One call, moving to the next member while a member provably did nothing (connection
        refused, connect timeout, or it answered "unavailable / no leader"), every member at
        most once and all within one connect + read timeout: the hop budget. A read timeout
        after the request was sent is not retried (the write may have applied): the next call
        goes to the next member."""
        deadline = time.monotonic() + self.timeout[0] + self.timeout[1]
        request_ends = _REQUEST_DEADLINE.get()
        if request_ends is not None:
            if request_ends - time.monotonic() <= 0.05:
                raise EtcdUnavailable("the request's etcd budget is spent; nothing was sent")
            deadline = min(deadline, request_ends)
        last = EtcdUnavailable("etcd call out of time")
        for _attempt in range(len(self.urls)):
            member = self.url
            remaining = deadline - time.monotonic()
            if remaining <= 0.05:
                break
            try:
                return self._post_once(member, path, body, timeout, remaining)
            except _Refused as exc:
                self._next_member(member)
                last = exc.unavailable
            except EtcdUnavailable:
                self._next_member(member)
                raise
        raise last

    def _post_once(
        self, member: str, path: str, body: dict[str, Any], timeout: float | None, remaining: float
    ) -> dict[str, Any]:
        connect, read = timeout or self.timeout
        hop = Budget(min(connect, remaining), max(0.05, min(read, remaining)), 0, "etcd call")
        try:
            reply = exchange(
                "POST", f"{member}/v3/{path}", hop=hop, json_body=body, pool=self.pools[member]
            )
        except TransportError as exc:
            unavailable = EtcdUnavailable(f"etcd unreachable: {type(exc.cause).__name__}")
            if not exc.sent:  # no byte of the call left: the member did nothing
                raise _Refused(unavailable) from exc
            raise unavailable from exc
        data = reply.body if isinstance(reply.body, dict) else {}
        if reply.status == 200 and "error" not in data:
            return data
        message = str(data.get("message") or data.get("error") or f"HTTP {reply.status}")
        code = data.get("code")
        if (
            reply.status in (502, 503, 504)
            or code in _UNAVAILABLE_GRPC
            or any(text in message for text in _UNAVAILABLE_TEXT)
        ):
            unavailable = EtcdUnavailable(f"etcd unavailable: {message}", code)
            if "no leader" in message or "not capable" in message or "stopped" in message:
                raise _Refused(unavailable)  # refused before proposing: nothing applied
            raise unavailable
        raise EtcdError(f"etcd error: {message}", code)

    # -- KV

    def range(self, key: str, *, prefix: bool = False, count_only: bool = False) -> RangeResult:
        return _range_result(
            self._post("kv/range", get(key, prefix=prefix, count_only=count_only)["request_range"])
        )

    def txn(
        self,
        compares: list[dict[str, Any]],
        success: list[dict[str, Any]],
        failure: list[dict[str, Any]] | None = None,
    ) -> TxnResult:
        data = self._post(
            "kv/txn", {"compare": compares, "success": success, "failure": failure or []}
        )
        responses: list[RangeResult | None] = []
        for item in data.get("responses", []):
            if "response_range" in item:
                responses.append(_range_result(item["response_range"]))
            elif "response_delete_range" in item:
                deleted = item["response_delete_range"]
                responses.append(
                    RangeResult(
                        kvs=[_kv(kv) for kv in deleted.get("prev_kvs", [])],
                        count=int(deleted.get("deleted", 0)),
                    )
                )
            else:
                responses.append(None)
        return TxnResult(
            succeeded=bool(data.get("succeeded", False)),
            revision=int(data["header"]["revision"]),
            responses=responses,
        )

    def read(self, *ops: dict[str, Any]) -> TxnResult:
        """Several ranges at one revision (a txn with no compares always takes `success`)."""
        return self.txn([], list(ops))

    # -- leases

    def lease_grant(self, ttl_s: int) -> tuple[int, int]:
        """A new lease; returns (id, granted TTL in seconds: etcd may raise it to its minimum)."""
        data = self._post("lease/grant", {"TTL": str(ttl_s)})
        return int(data["ID"]), int(data.get("TTL", ttl_s))

    def lease_keepalive(self, lease_id: int) -> int:
        """Refresh once; the lease's TTL in seconds, 0 when it has expired or never existed."""
        data = self._post("lease/keepalive", {"ID": str(lease_id)})
        return int(data.get("result", {}).get("TTL", 0))

    def lease_revoke(self, lease_id: int) -> bool:
        """Revoke (deleting every attached key at once); False when it was already gone."""
        try:
            self._post("lease/revoke", {"ID": str(lease_id)})
        except EtcdUnavailable:
            raise
        except EtcdError as exc:
            if "not found" in str(exc):
                return False
            raise
        return True

    # -- cluster

    def status(self, timeout: float | None = None) -> dict[str, Any]:
        return self._post(
            "maintenance/status",
            {},
            timeout=(self.timeout[0], timeout) if timeout else None,
        )

    def has_leader(self) -> bool:
        return str(self.status().get("leader", "0")) not in ("0", "")

    # -- watch

    def _open_watch(self, creates: list[dict[str, Any]], *, read_timeout_s: float) -> Stream:
        """One watch stream, a watcher per create_request, on the member's pool (its TLS
        settings and client certificate). A member that provably got nothing (refused, connect
        timeout, TLS handshake) hands the watch to the next, each member at most once; anything
        else, or no member left, is EtcdUnavailable."""
        body = b"".join(orjson.dumps({"create_request": create}) + b"\n" for create in creates)
        last = EtcdUnavailable("no etcd member to watch on")
        for _attempt in range(len(self.urls)):
            member = self.url
            try:
                stream = open_stream(
                    "POST",
                    f"{member}/v3/watch",
                    connect_s=self.timeout[0],
                    read_s=read_timeout_s,
                    body=body,
                    headers=_WATCH_HEADERS,
                    pool=self.pools[member],
                )
            except TransportError as exc:
                self._next_member(member)
                last = EtcdUnavailable(f"etcd unreachable: {type(exc.cause).__name__}")
                if exc.sent:
                    raise last from exc
                continue
            if stream.status != 200:
                stream.close()
                self._next_member(member)
                raise EtcdUnavailable(f"watch refused with HTTP {stream.status}")
            return stream
        raise last

    def wait_for_change(
        self,
        keys: list[str],
        *,
        after_revision: int,
        timeout_s: float,
        deletions_only: bool = False,
    ) -> bool:
        """Block until any of `keys` changes (is deleted, with `deletions_only`) after
        `after_revision`, or `timeout_s` passes.

        One gateway stream with one watcher per key, starting at after_revision + 1 so a change
        between the caller's read and this call is not missed. True on a change, False on
        timeout. The connection is closed on every return, which cancels the watchers
        server-side.
        """
        deadline = time.monotonic() + timeout_s
        creates: list[dict[str, Any]] = [
            {"key": _b64(key), "start_revision": str(after_revision + 1)} for key in keys
        ]
        if deletions_only:
            for create in creates:
                create["filters"] = ["NOPUT"]
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        with self._open_watch(creates, read_timeout_s=remaining) as stream:
            try:
                for line in stream.lines():
                    result = orjson.loads(line).get("result", {})
                    if result.get("events"):
                        return True
                    if result.get("canceled") or result.get("compact_revision"):
                        return True  # the caller re-reads; a compacted watch is a change
                    if time.monotonic() >= deadline:
                        return False
            except TransportError:
                if time.monotonic() >= deadline - 0.05:
                    return False  # the read deadline is our deadline
                raise EtcdUnavailable("watch stream broke") from None
            # the server closed the stream: treat as "look again" unless the deadline passed
            return time.monotonic() < deadline

    def deletions(
        self, prefixes: list[str], *, after_revision: int, idle_timeout_s: float
    ) -> Iterator[tuple[int, KeyValue | None]]:
        """Yield (revision, previous kv) for every key deleted under `prefixes`.

        One stream, one watcher per prefix (NOPUT, prev_kv), from after_revision + 1. Yields
        (revision, None) as a heartbeat when the stream is idle for idle_timeout_s, then ends,
        so the caller can check for shutdown and reconnect from the last revision it saw.
        """
        creates = [
            {
                "key": _b64(prefix),
                "range_end": _b64(prefix_end(prefix)),
                "start_revision": str(after_revision + 1),
                "filters": ["NOPUT"],
                "prev_kv": True,
            }
            for prefix in prefixes
        ]
        revision = after_revision
        with self._open_watch(creates, read_timeout_s=idle_timeout_s) as stream:
            try:
                for line in stream.lines(idle_s=idle_timeout_s):
                    result = orjson.loads(line).get("result", {})
                    if result.get("compact_revision"):
                        revision = max(revision, int(result["compact_revision"]) - 1)
                        return
                    for event in result.get("events", []):
                        kv = _kv(event["prev_kv"]) if event.get("prev_kv") else None
                        revision = max(revision, int(event["kv"].get("mod_revision", revision)))
                        yield revision, kv
            except TransportError:
                yield revision, None  # idle (read deadline) or broken: the caller reconnects
