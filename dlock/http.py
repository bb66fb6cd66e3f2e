"""One HTTP exchange for dlock's own hops, on urllib3: budgeted timeouts, trace and owner
headers, no retries, and a `sent` verdict a payments caller can act on.

urllib3 (the transport `requests` is built on) frames and parses HTTP; this module only decides
what dlock needs on top of it (ARCHITECTURE decision 19, CHANGELOG row "clients on urllib3"):

- **No retry, no redirect** inside the library: every pool is made with `retries=False`, so a
  POST is presented at most once per call (urllib3's default would silently re-send a request
  whose pooled connection dropped). Retries are the caller's decision (`dlock.client.RetryPolicy`,
  or an explicit loop that reads `dlock.budgets`).
- **`sent`** on a TransportError is False only when no request byte can have left this process:
  the request could not be written as valid HTTP, or the connection could not be opened —
  urllib3's `connect()` raised (NewConnectionError, NameResolutionError, ConnectTimeoutError, or
  the TLS handshake's ssl error). One place decides it (`_round_trip`, streams included): the
  connect is its own step, before the request, on a connection taken from urllib3's pool;
  anything raised after it — a reused keep-alive connection the server had just closed
  included — is `sent=True`, outcome unknown.
- **One read deadline per response**: `read_s` bounds the whole answer (head and body), not each
  read, so a peer that trickles its answer cannot stretch it (`_DeadlineIO`, the reader of the
  socket `_round_trip` wraps when it connects; urllib3's connection classes are used as they are).
- **Pools per origin**, shared by the process's threads and sized by the caller
  (`pool_for(url, size=N)`); a thread never waits for a connection. A connection idle for longer
  than MAX_IDLE_S is closed, not reused: the servers close idle keep-alive connections after a few
  seconds, and a request racing that close could not tell whether it was received.
- **Limits**: an answer larger than MAX_BODY_BYTES is a transport failure, not a memory blow-up.
- **Streams** (`dlock.http_stream.open_stream`): an answer read line by line as it arrives
  (etcd's watches), on a new connection made by the origin's pool, closed when the reader is done.
- **TLS**: `https://` peers are verified against the PEM bundle named by `DLOCK_CA_BUNDLE`
  when it is set, else against the system store; verification is never turned off. A process
  given `DLOCK_CLIENT_CERT` and `DLOCK_CLIENT_KEY` presents that certificate (etcd's
  --client-cert-auth).
"""

from __future__ import annotations

import http.client
import io
import json
import os
import re
import threading
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import quote, urlencode, urlsplit

import orjson
from urllib3 import BaseHTTPResponse, HTTPConnectionPool, HTTPSConnectionPool
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.exceptions import HTTPError as Urllib3Error

from dlock.budgets import Budget
from dlock.tracing import traceparent

# Idle connections kept per origin unless a caller asks for more (`pool_for(url, size=N)`).
DEFAULT_POOL_SIZE = 16
# An idle connection older than this is closed, not reused (the servers' keep-alive is longer).
MAX_IDLE_S = 2.0
# A response body larger than this is a transport failure (a hostile or broken peer).
MAX_BODY_BYTES = 32 * 1024 * 1024
# The env variable naming the PEM bundle every dlock client verifies https:// peers against.
CA_BUNDLE_ENV = "DLOCK_CA_BUNDLE"
CLIENT_CERT_ENV = "DLOCK_CLIENT_CERT"
CLIENT_KEY_ENV = "DLOCK_CLIENT_KEY"
# Characters a request target may carry as they are (RFC 3986 unreserved, sub-delims, ":@/%?");
# anything else is percent-encoded, as requests does.
_TARGET_SAFE = "/%:@!$&'()*+,;=-._~?"
_TARGET_UNSAFE = re.compile(r"[^A-Za-z0-9/%:@!$&'()*+,;=\-._~?]")
# A header name is an RFC 9110 token; a value has no control characters but tab.
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_BAD_VALUE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_TRANSPORT_ERRORS = (Urllib3Error, http.client.HTTPException, OSError, ValueError)


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
    """A received HTTP response: status, parsed JSON body (or None) and headers (looked up
    case-insensitively; a repeated field reads as its values joined by ", ")."""

    status: int
    body: Any
    headers: Mapping[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


# -- connections: the one read deadline, the idle limit --------------------------------------


class _BoundedSocket:
    """A connected socket as urllib3 and http.client see it, except that the reader http.client
    makes from it (`makefile`) keeps the current request's deadline; `used_at` is when the
    connection last finished an exchange (an idle one past MAX_IDLE_S is not reused)."""

    __slots__ = ("_sock", "deadline", "used_at")

    def __init__(self, sock: Any) -> None:
        self._sock = sock
        self.deadline: float | None = None  # monotonic: the whole response must be in by then
        self.used_at = time.monotonic()

    def makefile(self, mode: str = "rb", *args: Any, **kwargs: Any) -> io.BufferedReader:
        raw = self._sock.makefile("rb", buffering=0)  # counts as a reference, like http.client's
        return io.BufferedReader(_DeadlineIO(raw, self))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


class _DeadlineIO(io.RawIOBase):
    """The socket's reader with the request's deadline: every read waits at most for what is
    left of it, and none starts after it. http.client reads the head and body through this."""

    def __init__(self, raw: io.RawIOBase, bounded: _BoundedSocket) -> None:
        self._raw = raw
        self._bounded = bounded

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int | None:
        deadline = self._bounded.deadline
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the response did not complete within the read budget")
            self._bounded._sock.settimeout(left)
        return self._raw.readinto(buffer)

    def close(self) -> None:
        self._raw.close()
        super().close()


def _connected(conn: HTTPConnection, connect_s: float) -> _BoundedSocket:
    """`conn`'s socket, connected now unless it is a kept-alive one used within MAX_IDLE_S (the
    servers close idle keep-alive connections after a few seconds, and a request racing that
    close could not tell whether it was received)."""
    sock = conn.sock
    if isinstance(sock, _BoundedSocket) and time.monotonic() - sock.used_at <= MAX_IDLE_S:
        return sock
    conn.close()
    conn.timeout = connect_s
    try:
        conn.connect()
    except BaseException:
        conn.close()
        raise
    bounded = _BoundedSocket(conn.sock)
    conn.sock = bounded
    return bounded


def _round_trip(
    conn: HTTPConnection,
    method: str,
    url: str,
    *,
    target: str,
    body: bytes | None,
    headers: dict[str, str],
    connect_s: float,
    read_s: float,
    whole: bool = True,
) -> tuple[BaseHTTPResponse, bytes, _BoundedSocket]:
    """One request and its answer on `conn` (the whole body, or with `whole` False the head only,
    the body left to read from the socket returned): the one place `sent` is decided, for
    exchanges and streams alike. A failure to connect sent nothing; whatever fails after it may
    have reached the server."""
    try:
        sock = _connected(conn, connect_s)
    except _TRANSPORT_ERRORS as exc:
        raise TransportError(method, url, sent=False, cause=exc) from exc
    sock.deadline = time.monotonic() + read_s
    try:
        conn.timeout = connect_s  # the writes; the reads keep the one deadline
        try:
            conn.request(method, target, body=body, headers=headers, preload_content=False)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server may have answered before it closed (a 413, say): read it
        conn.timeout = read_s
        response = conn.getresponse()
        raw = _read_body(response) if whole else b""
    except _TRANSPORT_ERRORS as exc:
        conn.close()
        raise TransportError(method, url, sent=True, cause=exc) from exc
    sock.used_at = time.monotonic()
    return response, raw, sock


def ca_bundle() -> str | None:
    """The CA bundle every dlock client verifies an https peer against (DLOCK_CA_BUNDLE);
    None means the system store."""
    return os.environ.get(CA_BUNDLE_ENV) or None


def client_certificate() -> tuple[str, str] | None:
    """(certificate, key) this process presents to an https peer that asks for one (etcd run
    with --client-cert-auth): DLOCK_CLIENT_CERT and DLOCK_CLIENT_KEY, or None."""
    cert, key = os.environ.get(CLIENT_CERT_ENV), os.environ.get(CLIENT_KEY_ENV)
    return (cert, key) if cert and key else None


def _tls_options(scheme: str) -> dict[str, Any]:
    """Verification settings for an https origin: DLOCK_CA_BUNDLE, else the system store; and
    the client certificate, when this process has one."""
    if scheme != "https":
        return {}
    options: dict[str, Any] = {"cert_reqs": "CERT_REQUIRED", "ca_certs": ca_bundle()}
    client = client_certificate()
    if client:
        options |= {"cert_file": client[0], "key_file": client[1]}
    return options


def _origin(url: str) -> tuple[str, str, int]:
    parts = urlsplit(url)
    scheme = parts.scheme or "http"
    if scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {url!r}")
    return scheme, parts.hostname, parts.port or (443 if scheme == "https" else 80)


class ConnectionPool:
    """Keep-alive connections to one origin (a urllib3 pool), shared by the process's threads.

    `size` bounds the idle connections kept, not the connections in use: a thread never waits for
    a connection, it opens one when none is idle, and one returned to a full pool is closed.
    """

    def __init__(self, scheme: str, host: str, port: int, *, size: int = DEFAULT_POOL_SIZE) -> None:
        self.scheme = scheme
        self.host = host
        self.port = port
        self.size = size
        self._mutex = threading.Lock()
        self.urllib3 = self._new(size)
        _every_pool.add(self)

    def _new(self, size: int) -> HTTPConnectionPool:
        cls = HTTPSConnectionPool if self.scheme == "https" else HTTPConnectionPool
        return cls(
            self.host,
            self.port,
            maxsize=size,
            block=False,
            retries=False,  # never re-send, never follow a redirect
            **_tls_options(self.scheme),
        )

    def __repr__(self) -> str:
        return f"<ConnectionPool {self.scheme}://{self.host}:{self.port} size={self.size}>"

    def grow(self, size: int) -> None:
        """Keep at least `size` idle connections (done when a caller is set up, not per call)."""
        with self._mutex:
            if size <= self.size:
                return
            old, self.size = self.urllib3, size
            self.urllib3 = self._new(size)
        old.close()

    def idle(self) -> int:
        """Idle connections kept right now (for tests and diagnostics)."""
        queue = self.urllib3.pool
        return 0 if queue is None else sum(1 for conn in list(queue.queue) if conn is not None)

    def close(self) -> None:
        with self._mutex:
            old = self.urllib3
            self.urllib3 = self._new(self.size)
        old.close()


_pools: dict[tuple[str, str, int], ConnectionPool] = {}
_pools_mutex = threading.Lock()
_every_pool: weakref.WeakSet[ConnectionPool] = weakref.WeakSet()


def _forget_after_fork() -> None:
    """In a forked child: never share the parent's connections (or a lock a parent thread held).
    The parent's sockets are dropped, not closed: closing them here could end its requests."""
    global _pools_mutex
    _pools_mutex = threading.Lock()
    for pool in list(_every_pool):
        pool._mutex = threading.Lock()
        pool.urllib3 = pool._new(pool.size)


os.register_at_fork(after_in_child=_forget_after_fork)


def pool_for(url: str, *, size: int | None = None) -> ConnectionPool:
    """The process's pool for `url`'s origin, grown to at least `size` idle connections."""
    key = _origin(url)
    with _pools_mutex:
        pool = _pools.get(key)
        if pool is None:
            pool = _pools[key] = ConnectionPool(*key)
    if size is not None:
        pool.grow(size)
    return pool


def close_pools() -> None:
    """Close every idle connection of this process."""
    with _pools_mutex:
        pools = list(_pools.values())
    for pool in pools:
        pool.close()


# -- requests ----------------------------------------------------------------------------------


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


def decode_json(raw: bytes) -> Any:
    """The JSON value of an answer's body, or None when it is not JSON (or nests deeper than
    any parser here reads)."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        pass
    try:  # what orjson refuses and the stdlib reads (NaN, integers past 64 bits, UTF-16)
        return json.loads(raw)
    except (ValueError, RecursionError):  # not JSON, or nested deeper than any answer of ours
        return None


def _merge(into: dict[str, str], extra: Mapping[str, str | None]) -> None:
    """`extra` over `into`, names compared case-insensitively; a None value removes the field."""
    for name, value in extra.items():
        for existing in [k for k in into if k.lower() == name.lower()]:
            del into[existing]
        if value is not None:
            into[name] = value


def _checked(headers: dict[str, str]) -> dict[str, str]:
    """The headers as sent; ValueError for a name or value HTTP cannot carry (never written)."""
    out = {}
    for name, value in headers.items():
        text = str(value)
        if not _HEADER_NAME.fullmatch(name) or _BAD_VALUE.search(text):
            raise ValueError(f"header {name!r} cannot be sent as is")
        out[name] = text
    return out


def _read_body(response: BaseHTTPResponse) -> bytes:
    """The whole body, within MAX_BODY_BYTES (the connection's deadline bounds the reads)."""
    length = response.headers.get("content-length")
    if length is not None and length.strip().isdigit():
        if int(length) > MAX_BODY_BYTES:
            raise ValueError("response body too large")
        return response.read()  # framed by its length: one call
    chunks: list[bytes] = []
    size = 0
    while True:  # chunked or close-delimited: count as it comes
        chunk = response.read1(64 * 1024)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise ValueError("response body too large")
        chunks.append(chunk)


def exchange(
    method: str,
    url: str,
    *,
    hop: Budget,
    owner_id: str | None = None,
    json_body: Any = None,
    params: dict[str, Any] | None = None,
    headers: Mapping[str, str | None] | None = None,
    read_timeout_s: float | None = None,
    trace_id: str | None = None,
    pool: ConnectionPool | None = None,
) -> Reply:
    """Send one request within `hop`'s budget on a pooled keep-alive connection; raise
    TransportError when no response came. Never retried, never redirected."""
    sent_headers: dict[str, str] = {
        "Accept": "application/json",
        "Accept-Encoding": "identity",
        "traceparent": traceparent(trace_id),
    }
    if owner_id is not None:
        sent_headers["X-Owner-Id"] = owner_id
    if headers:
        _merge(sent_headers, headers)
    data: bytes | None = None
    if json_body is not None:
        data = _encode(json_body)
        sent_headers["Content-Type"] = "application/json; charset=utf-8"
    elif method not in ("GET", "HEAD"):
        data = b""  # Content-Length: 0
    read_s = read_timeout_s if read_timeout_s is not None else hop.read_s
    try:
        checked = _checked(sent_headers)
        target = _target(url, params)
        origin = (pool or pool_for(url)).urllib3
        # urllib3's pool lends an idle kept-alive connection, or a new unconnected one; what
        # `urlopen` does with it is done here in two steps, so the connect stands apart.
        conn = cast(HTTPConnection, origin._get_conn())
    except (ValueError, Urllib3Error) as exc:  # never written: nothing was sent
        raise TransportError(method, url, sent=False, cause=exc) from exc
    try:
        response, raw, _ = _round_trip(
            conn,
            method,
            url,
            target=target,
            body=data,
            headers=checked,
            connect_s=hop.connect_s,
            read_s=read_s,
        )
    except TransportError:
        origin._put_conn(None)  # a slot back; the connection is closed
        raise
    origin._put_conn(conn)
    return Reply(response.status, decode_json(raw) if raw else None, response.headers)


def send_once(
    method: str,
    url: str,
    *,
    connect_s: float,
    read_s: float,
    body: bytes,
    headers: Mapping[str, str],
) -> tuple[int, Mapping[str, str], bytes]:
    """One request on a fresh connection that is closed after it, never pooled or reused (the
    rail forward: a kept-alive connection could have died before the send). `read_s` is ONE
    deadline for sending the request and reading the whole answer.

    A bare urllib3 connection, not a one-connection pool: a pool made and closed per call (its
    queue, its retry and redirect bookkeeping) costs CPU for nothing a single exchange uses
    (docs/CHANGELOG.md)."""
    try:
        scheme, host, port = _origin(url)
        checked = _checked({"Accept-Encoding": "identity", **headers, "Connection": "close"})
        target = _target(url, None)
        cls = HTTPSConnection if scheme == "https" else HTTPConnection
        conn = cls(host, port, timeout=connect_s, **_tls_options(scheme))
    except ValueError as exc:
        raise TransportError(method, url, sent=False, cause=exc) from exc
    try:
        response, raw, _ = _round_trip(
            conn,
            method,
            url,
            target=target,
            body=body,
            headers=checked,
            connect_s=connect_s,
            read_s=read_s,
        )
        response.close()
        return response.status, response.headers, raw
    finally:
        conn.close()
