"""One HTTP exchange for dlock's own hops: budgeted timeouts, trace and owner headers, no retries.

Retries are the caller's decision (`dlock.client.RetryPolicy`, or an explicit loop that reads
`dlock.budgets`). This module never re-sends a request, so a POST is presented at most once per
call.

Connections are `http.client` keep-alive connections in one thread-safe pool per origin
(`ConnectionPool`), shared by every thread of the process; a caller with N threads in flight
asks for a pool of at least N (`pool_for(url, size=N)`). `requests` was measured at ~1 ms of CPU
per call in the executor (environment proxy look-ups, URL re-parsing, hooks, email-package header
parsing); this path does what dlock's hops need and nothing else.

When `sent` is False (TransportError): the connection could not be opened (refused, connect
timeout, no route, TLS handshake failed), so no request byte left this process. Anything that goes
wrong after the request started to go out — including on a reused connection the server had
closed — is `sent=True`: the caller cannot know whether the server acted.
"""

from __future__ import annotations

import http.client
import json
import re
import select
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

import orjson

from dlock.budgets import Budget
from dlock.tracing import traceparent

# Idle connections kept per origin unless a caller asks for more (`pool_for(url, size=N)`).
DEFAULT_POOL_SIZE = 16
# An idle connection older than this is closed, not reused: the servers close keep-alive
# connections after GUNICORN_KEEPALIVE (5 s), and a request racing that close could not tell
# whether it was received.
MAX_IDLE_S = 2.0
# Characters a request target may carry as they are (RFC 3986 unreserved, sub-delims, ":@/%?");
# anything else is percent-encoded, as requests did.
_TARGET_SAFE = "/%:@!$&'()*+,;=-._~?"
_TARGET_UNSAFE = re.compile(r"[^A-Za-z0-9/%:@!$&'()*+,;=\-._~?]")


class TransportError(Exception):
    """No HTTP response: `sent` is False only when nothing can have reached the server."""

    def __init__(self, method: str, url: str, *, sent: bool, cause: BaseException) -> None:
        self.method = method
        self.url = url
        self.sent = sent
        self.cause = cause
        what = "read failed after sending" if sent else "could not connect"
        super().__init__(f"{method} {url}: {what}: {cause.__class__.__name__}: {cause}")


@dataclass
class Reply:
    """A received HTTP response: status, parsed JSON body (or None) and headers."""

    status: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


class ConnectionPool:
    """Idle keep-alive connections to one origin, most recently used first; thread-safe.

    `size` bounds the idle connections kept, not the connections in use: a thread never waits
    for a connection, it opens one when none is idle, and one returned to a full pool is closed.
    """

    def __init__(self, scheme: str, host: str, port: int, *, size: int = DEFAULT_POOL_SIZE) -> None:
        self.scheme = scheme
        self.host = host
        self.port = port
        self.size = size
        self._idle: deque[tuple[http.client.HTTPConnection, float]] = deque()
        self._mutex = threading.Lock()

    def __repr__(self) -> str:
        return f"<ConnectionPool {self.scheme}://{self.host}:{self.port} size={self.size}>"

    def grow(self, size: int) -> None:
        with self._mutex:
            self.size = max(self.size, size)

    def idle(self) -> int:
        with self._mutex:
            return len(self._idle)

    def take(self) -> http.client.HTTPConnection | None:
        """An idle connection the server has not closed, or None (the caller opens one)."""
        now = time.monotonic()
        while True:
            with self._mutex:
                if not self._idle:
                    return None
                conn, since = self._idle.pop()
            if now - since <= MAX_IDLE_S and not _dropped(conn):
                return conn
            conn.close()

    def give_back(self, conn: http.client.HTTPConnection) -> None:
        with self._mutex:
            if len(self._idle) < self.size:
                self._idle.append((conn, time.monotonic()))
                return
        conn.close()

    def open(self, connect_s: float) -> http.client.HTTPConnection:
        """A new connection, connected; OSError when it could not be (nothing was sent)."""
        if self.scheme == "https":
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                self.host, self.port, timeout=connect_s
            )
        else:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=connect_s)
        conn.connect()
        assert conn.sock is not None
        conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn

    def close(self) -> None:
        with self._mutex:
            idle = list(self._idle)
            self._idle.clear()
        for conn, _ in idle:
            conn.close()


def _dropped(conn: http.client.HTTPConnection) -> bool:
    """True when an idle connection is readable (the server closed it, or sent junk)."""
    sock = conn.sock
    if sock is None:
        return True
    try:
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        return bool(poller.poll(0))
    except (OSError, ValueError):
        return True


_pools: dict[tuple[str, str, int], ConnectionPool] = {}
_pools_mutex = threading.Lock()


def pool_for(url: str, *, size: int | None = None) -> ConnectionPool:
    """The process's pool for `url`'s origin, grown to at least `size` idle connections."""
    parts = urlsplit(url)
    scheme = parts.scheme or "http"
    if scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {url!r}")
    port = parts.port or (443 if scheme == "https" else 80)
    key = (scheme, parts.hostname, port)
    with _pools_mutex:
        pool = _pools.get(key)
        if pool is None:
            pool = _pools[key] = ConnectionPool(scheme, parts.hostname, port)
    if size is not None:
        pool.grow(size)
    return pool


def close_pools() -> None:
    """Close every idle connection of this process (after a fork, or at exit)."""
    with _pools_mutex:
        pools = list(_pools.values())
    for pool in pools:
        pool.close()


def _target(url: str, params: dict[str, Any] | None) -> str:
    """The request target (path and query) of `url`, with `params` appended form-encoded."""
    rest = url.split("://", 1)[-1]
    slash = rest.find("/")
    target = rest[slash:] if slash >= 0 else "/"
    if _TARGET_UNSAFE.search(target):
        target = quote(target, safe=_TARGET_SAFE)
    if params:
        query = urlencode(params, doseq=True)
        target += ("&" if "?" in target else "?") + query
    return target


def _encode(json_body: Any) -> bytes:
    try:
        return orjson.dumps(json_body)
    except TypeError:  # what orjson does not serialise natively, as the stdlib would
        return json.dumps(json_body, separators=(",", ":")).encode()


def _decode(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        pass
    try:  # what orjson refuses and the stdlib reads (NaN, integers past 64 bits, UTF-16)
        return json.loads(raw)
    except ValueError:
        return None


def exchange(
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
    """Send one request within `hop`'s budget; raise TransportError when no response came."""
    sent_headers = {
        "Accept": "application/json",
        "Connection": "keep-alive",
        "traceparent": traceparent(trace_id),
    }
    if owner_id is not None:
        sent_headers["X-Owner-Id"] = owner_id
    if headers:
        sent_headers.update(headers)
    data = None
    if json_body is not None:
        data = _encode(json_body)
        sent_headers["Content-Type"] = "application/json; charset=utf-8"
    elif method not in ("GET", "HEAD"):
        sent_headers["Content-Length"] = "0"
    pool = pool or pool_for(url)
    target = _target(url, params)
    read_s = read_timeout_s if read_timeout_s is not None else hop.read_s
    conn = pool.take()
    if conn is None:
        try:
            conn = pool.open(hop.connect_s)
        except OSError as exc:  # refused, connect timeout, no route, TLS: nothing was sent
            raise TransportError(method, url, sent=False, cause=exc) from exc
    try:
        assert conn.sock is not None
        conn.sock.settimeout(read_s)
        conn.request(method, target, body=data, headers=sent_headers)
        response = conn.getresponse()
        raw = response.read()
    except (OSError, http.client.HTTPException, ValueError) as exc:
        conn.close()
        raise TransportError(method, url, sent=True, cause=exc) from exc
    if response.will_close:
        conn.close()
    else:
        pool.give_back(conn)
    return Reply(response.status, _decode(raw) if raw else None, dict(response.getheaders()))
