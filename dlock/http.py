"""One HTTP exchange for dlock's own hops: budgeted timeouts, trace and owner headers, no retries.

Retries are the caller's decision (`dlock.client.RetryPolicy`, or an explicit loop that reads
`dlock.budgets`). This module never re-sends a request, so a POST is presented at most once per
call.

Connections are plain HTTP/1.1 keep-alive sockets in one thread-safe pool per origin
(`ConnectionPool`), shared by every thread of the process; a caller with N threads in flight
asks for a pool of at least N (`pool_for(url, size=N)`). `requests` cost ~1.2 ms of CPU per
call in the executor (environment proxy look-ups, URL re-parsing, hooks, email-package header
parsing) and `http.client` ~0.2 ms (two sends per request, a file object and an email parser per
response); this path writes each request with one `sendall` and reads the response with a
buffer of its own: ~0.1 ms. It speaks what dlock's hops need: a request with a JSON body (or
none), a response framed by Content-Length, chunked transfer coding or the connection's close.

`sent` on a TransportError is False only when no request byte can have left this process: the
connection could not be opened (refused, connect timeout, no route, TLS handshake failed) or the
request could not be written as valid HTTP. Anything that goes wrong once the request started to
go out — including on a reused connection the server had just closed — is `sent=True`: the
caller cannot know whether the server acted.
"""

from __future__ import annotations

import json
import os
import re
import select
import socket
import ssl
import threading
import time
import weakref
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
# A response head or body larger than this is a protocol error (a hostile or broken peer).
MAX_HEAD_BYTES = 64 * 1024
MAX_BODY_BYTES = 32 * 1024 * 1024
RECV_BYTES = 64 * 1024
# Characters a request target may carry as they are (RFC 3986 unreserved, sub-delims, ":@/%?");
# anything else is percent-encoded, as requests did.
_TARGET_SAFE = "/%:@!$&'()*+,;=-._~?"
_TARGET_UNSAFE = re.compile(r"[^A-Za-z0-9/%:@!$&'()*+,;=\-._~?]")
# A header name is an RFC 7230 token; a value has no control characters but tab.
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_BAD_VALUE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_STATUS_LINE = re.compile(rb"HTTP/1\.([01]) ([0-9]{3})(?: [^\r\n]*)?")
_NO_BODY = frozenset({204, 304})


class TransportError(Exception):
    """No HTTP response: `sent` is False only when nothing can have reached the server."""

    def __init__(self, method: str, url: str, *, sent: bool, cause: BaseException) -> None:
        self.method = method
        self.url = url
        self.sent = sent
        self.cause = cause
        what = "read failed after sending" if sent else "could not connect"
        super().__init__(f"{method} {url}: {what}: {cause.__class__.__name__}: {cause}")


class ProtocolError(Exception):
    """The peer's bytes are not an HTTP/1.x response this client can frame."""


@dataclass
class Reply:
    """A received HTTP response: status, parsed JSON body (or None) and headers."""

    status: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


class Connection:
    """One open socket and the bytes read from it but not yet consumed."""

    __slots__ = ("buffer", "deadline", "idle_since", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = bytearray()
        self.idle_since = 0.0
        self.deadline: float | None = None  # monotonic: the whole response must be in by then

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def dropped(self) -> bool:
        """True when an idle connection is readable: the server closed it, or sent junk."""
        if self.buffer:
            return True
        try:
            poller = select.poll()
            poller.register(self.sock, select.POLLIN)
            return bool(poller.poll(0))
        except (OSError, ValueError):
            return True

    def _recv(self) -> bytes:
        """One read, within what is left of the response's deadline: a peer that trickles its
        answer byte by byte cannot stretch the read budget, which bounds the whole response."""
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the response did not complete within the read budget")
            self.sock.settimeout(left)
        return self.sock.recv(RECV_BYTES)

    def _fill(self) -> None:
        chunk = self._recv()
        if not chunk:
            raise ProtocolError("connection closed before the response ended")
        self.buffer += chunk

    def _line(self) -> bytes:
        while True:
            end = self.buffer.find(b"\r\n")
            if end >= 0:
                line = bytes(self.buffer[:end])
                del self.buffer[: end + 2]
                return line
            if len(self.buffer) > MAX_HEAD_BYTES:
                raise ProtocolError("line too long")
            self._fill()

    def _exactly(self, n: int) -> bytes:
        while len(self.buffer) < n:
            self._fill()
        data = bytes(self.buffer[:n])
        del self.buffer[:n]
        return data

    def _head(self) -> bytes:
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end >= 0:
                head = bytes(self.buffer[:end])
                del self.buffer[: end + 4]
                return head
            if len(self.buffer) > MAX_HEAD_BYTES:
                raise ProtocolError("response head too large")
            self._fill()

    def read_response(self, method: str) -> tuple[int, dict[str, str], bytes, bool]:
        """(status, headers, body, reusable) of the next response on this connection."""
        while True:
            head = self._head()
            status_line, _, header_block = head.partition(b"\r\n")
            match = _STATUS_LINE.fullmatch(status_line)
            if match is None:
                raise ProtocolError(f"bad status line {status_line[:80]!r}")
            status = int(match.group(2))
            if not 100 <= status < 200 or status == 101:
                break  # 1xx interim answers (we never ask for one) are skipped
        minor = match.group(1)
        headers = _parse_headers(header_block)
        lowered = {name.lower(): value for name, value in headers.items()}
        connection = lowered.get("connection", "").lower()
        reusable = minor == b"1" and "close" not in connection
        if method == "HEAD" or status in _NO_BODY or status == 101:
            return status, headers, b"", reusable and status != 101
        if "chunked" in lowered.get("transfer-encoding", "").lower():
            return status, headers, self._chunked(), reusable
        length = lowered.get("content-length")
        if length is not None:
            if not length.strip().isdigit():
                raise ProtocolError(f"bad Content-Length {length[:40]!r}")
            n = int(length)
            if n > MAX_BODY_BYTES:
                raise ProtocolError("response body too large")
            return status, headers, self._exactly(n), reusable
        return status, headers, self._until_close(), False

    def _chunked(self) -> bytes:
        body = bytearray()
        while True:
            size_field = self._line().split(b";", 1)[0].strip()
            try:
                size = int(size_field, 16)
            except ValueError:
                raise ProtocolError(f"bad chunk size {size_field[:40]!r}") from None
            if size == 0:
                while self._line():  # trailer fields, up to the blank line
                    pass
                return bytes(body)
            if len(body) + size > MAX_BODY_BYTES:
                raise ProtocolError("response body too large")
            body += self._exactly(size)
            if self._exactly(2) != b"\r\n":
                raise ProtocolError("chunk not followed by CRLF")

    def _until_close(self) -> bytes:
        while True:
            chunk = self._recv()
            if not chunk:
                body = bytes(self.buffer)
                self.buffer.clear()
                return body
            self.buffer += chunk
            if len(self.buffer) > MAX_BODY_BYTES:
                raise ProtocolError("response body too large")


def _parse_headers(block: bytes) -> dict[str, str]:
    """Header fields in arrival order, first spelling of each name; repeats joined by ", "."""
    headers: dict[str, str] = {}
    spelled: dict[str, str] = {}
    last: str | None = None
    for raw in block.decode("latin-1").split("\r\n"):
        if not raw:
            continue
        if raw[0] in " \t" and last is not None:  # obsolete line folding
            headers[last] = f"{headers[last]} {raw.strip()}"
            continue
        name, colon, value = raw.partition(":")
        if not colon or not name or name != name.strip():
            raise ProtocolError(f"bad header line {raw[:80]!r}")
        value = value.strip()
        key = spelled.setdefault(name.lower(), name)
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
        last = key
    return headers


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
        default_port = 443 if scheme == "https" else 80
        bracketed = f"[{host}]" if ":" in host else host
        self.host_header = bracketed if port == default_port else f"{bracketed}:{port}"
        self._tls: ssl.SSLContext | None = None
        self._idle: deque[Connection] = deque()
        self._mutex = threading.Lock()
        _every_pool.add(self)

    def __repr__(self) -> str:
        return f"<ConnectionPool {self.scheme}://{self.host_header} size={self.size}>"

    def grow(self, size: int) -> None:
        with self._mutex:
            self.size = max(self.size, size)

    def idle(self) -> int:
        with self._mutex:
            return len(self._idle)

    def take(self) -> Connection | None:
        """An idle connection the server has not closed, or None (the caller opens one)."""
        now = time.monotonic()
        while True:
            with self._mutex:
                if not self._idle:
                    return None
                conn = self._idle.pop()
            if now - conn.idle_since <= MAX_IDLE_S and not conn.dropped():
                return conn
            conn.close()

    def give_back(self, conn: Connection) -> None:
        conn.idle_since = time.monotonic()
        with self._mutex:
            if len(self._idle) < self.size:
                self._idle.append(conn)
                return
        conn.close()

    def open(self, connect_s: float) -> Connection:
        """A new connection, connected; OSError when it could not be (nothing was sent)."""
        sock = socket.create_connection((self.host, self.port), timeout=connect_s)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.scheme == "https":
                if self._tls is None:
                    self._tls = ssl.create_default_context()
                sock = self._tls.wrap_socket(sock, server_hostname=self.host)
        except BaseException:
            sock.close()
            raise
        return Connection(sock)

    def close(self) -> None:
        with self._mutex:
            idle = list(self._idle)
            self._idle.clear()
        for conn in idle:
            conn.close()


_pools: dict[tuple[str, str, int], ConnectionPool] = {}
_pools_mutex = threading.Lock()
_every_pool: weakref.WeakSet[ConnectionPool] = weakref.WeakSet()


def _forget_after_fork() -> None:
    """In a forked child: never share the parent's sockets (or a lock a parent thread held)."""
    global _pools_mutex
    _pools_mutex = threading.Lock()
    for pool in list(_every_pool):
        pool._idle = deque()
        pool._mutex = threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)


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
    """Close every idle connection of this process."""
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


def request_bytes(
    method: str, target: str, host: str, headers: dict[str, str], body: bytes | None
) -> bytes:
    """The request as it goes on the wire; ValueError for a name or value HTTP cannot carry."""
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}"]
    for name, value in headers.items():
        value = str(value)
        if not _HEADER_NAME.fullmatch(name) or _BAD_VALUE.search(value):
            raise ValueError(f"header {name!r} cannot be sent as is")
        lines.append(f"{name}: {value}")
    if body is not None:
        lines.append(f"Content-Length: {len(body)}")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head + body if body else head


def _merge(into: dict[str, str], extra: dict[str, str]) -> None:
    """`extra` over `into`, names compared case-insensitively; a None value removes the field."""
    for name, value in extra.items():
        for existing in [k for k in into if k.lower() == name.lower()]:
            del into[existing]
        if value is not None:
            into[name] = value


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
        "Accept-Encoding": "identity",
        "Connection": "keep-alive",
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
        data = b""  # Content-Length: 0, as requests sent
    pool = pool or pool_for(url)
    try:
        wire = request_bytes(method, _target(url, params), pool.host_header, sent_headers, data)
    except ValueError as exc:  # never written: nothing was sent
        raise TransportError(method, url, sent=False, cause=exc) from exc
    read_s = read_timeout_s if read_timeout_s is not None else hop.read_s
    conn = pool.take()
    if conn is None:
        try:
            conn = pool.open(hop.connect_s)
        except OSError as exc:  # refused, connect timeout, no route, TLS: nothing was sent
            raise TransportError(method, url, sent=False, cause=exc) from exc
    try:
        conn.sock.settimeout(read_s)
        conn.deadline = time.monotonic() + read_s
        conn.sock.sendall(wire)
        status, reply_headers, raw, reusable = conn.read_response(method)
    except (OSError, ProtocolError, ValueError) as exc:
        conn.close()
        raise TransportError(method, url, sent=True, cause=exc) from exc
    if reusable and not conn.buffer:
        pool.give_back(conn)
    else:
        conn.close()
    return Reply(status, decode_json(raw) if raw else None, reply_headers)
