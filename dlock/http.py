"""dlock's HTTP requests, on urllib3's documented surface: budgeted timeouts, trace and owner
headers, no retries, and a `sent` verdict a payments caller can act on.

urllib3 (the transport `requests` is built on) frames and parses HTTP and keeps the pools; this
module only decides what dlock needs on top of it (ARCHITECTURE decision 19, CHANGELOG rows
"clients on urllib3" and "urllib3's documented surface"):

- **One request function** (`request`): `pool.urlopen(..., retries=NO_RETRY, redirect=False,
  preload_content=False)` and the body read, for exchanges (`exchange`), one-shot sends
  (`send_once`) alike; what does not change
  between calls (the Retry, a Timeout per budget, an origin, a header name's check) made once.
- **No retry, no redirect** inside the library: a POST is presented at most once per call
  (urllib3's default would silently re-send a request whose pooled connection dropped). Retries
  are the caller's decision (`dlock.client.RetryPolicy`, or an explicit loop over
  `dlock.budgets`).
- **`sent`** on a TransportError is False only when no request byte can have left this process:
  the request could not be written as valid HTTP, or urllib3 raised one of its connect-phase
  types (`ConnectTimeoutError` and its subclasses `NewConnectionError`,
  `NameResolutionError`; a closed pool). dlock's connection classes (`dlock.http_connection`,
  through the pools' `ConnectionCls` hook) raise those types for every failure of their
  `connect()`, the TLS handshake included, so the verdict is the exception's type. Anything
  raised after the connect (a reused keep-alive connection the server had just closed
  included) is `sent=True`, outcome unknown.
- **One read deadline per response** for the whole answer, and **no reuse of a connection idle
  for longer than MAX_IDLE_S** (the servers close idle keep-alive connections after a few
  seconds, and a request racing that close could not tell whether it was received): the
  connection classes of `dlock.http_connection`.
- **Pools per origin**, shared by the process's threads and sized by the caller
  (`pool_for(url, size=N)`); a thread never waits for a connection. One-shot connections
  (`send_once`) come from a pool whose connections serve one request each.
- **Limits**: an answer larger than MAX_BODY_BYTES is a transport failure, not a memory blow-up.
- **TLS**: `https://` peers are verified against the PEM bundle named by `DLOCK_CA_BUNDLE`
  when it is set, else against the system store; verification is never turned off. A process
  given `DLOCK_CLIENT_CERT` and `DLOCK_CLIENT_KEY` presents that certificate (etcd's
  --client-cert-auth).
"""

from __future__ import annotations

import functools
import http.client
import json
import os
import re
import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

import orjson
from urllib3 import BaseHTTPResponse, HTTPConnectionPool, Retry, Timeout
from urllib3.exceptions import ClosedPoolError, ConnectTimeoutError, ProtocolError, SSLError
from urllib3.exceptions import HTTPError as Urllib3Error

from dlock.budgets import Budget
from dlock.http_connection import Pool, TLSPool, idle_connections
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
_header_name = functools.lru_cache(maxsize=1024)(_HEADER_NAME.fullmatch)  # once per name
_BAD_VALUE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
# `scheme://authority` of a URL: what urlsplit reads the origin from.
_ORIGIN_PREFIX = re.compile(r"[^:/?#]*://[^/?#]*")
# What a request can fail with once urllib3 has it. Of these, NOT_SENT_ERRORS are urllib3's
# connect-phase types (and a pool closed under the caller): no request byte was written.
TRANSPORT_ERRORS = (Urllib3Error, http.client.HTTPException, OSError, ValueError)
NOT_SENT_ERRORS = (ConnectTimeoutError, ClosedPoolError)
# No retry, no redirect: what urllib3 makes of `retries=False` per call, made once.
NO_RETRY = Retry(total=False, redirect=False)
# urllib3's Timeout per (connect, read) pair, made once: urllib3 copies it, never changes it.
_timeout = functools.lru_cache(maxsize=256)(Timeout)


class TransportError(Exception):
    """No HTTP response: `sent` is False only when nothing can have reached the server. `cause`
    is what failed underneath urllib3's wrapping (a refused connect, an ssl error, a timeout)."""

    def __init__(self, method: str, url: str, *, sent: bool, cause: BaseException) -> None:
        self.method = method
        self.url = url
        self.sent = sent
        self.cause = _underneath(cause)
        what = "read failed after sending" if sent else "could not connect"
        super().__init__(f"{method} {url}: {what}: {cause.__class__.__name__}: {cause}")


def _underneath(exc: BaseException) -> BaseException:
    """The failure urllib3 wrapped: ProtocolError("Connection aborted.", error), SSLError(error),
    or a connect-phase error raised from the handshake's own."""
    if isinstance(exc, (ProtocolError, SSLError)):
        inner = [arg for arg in exc.args if isinstance(arg, BaseException)]
        return inner[-1] if inner else exc
    if isinstance(exc, ConnectTimeoutError) and exc.__cause__ is not None:
        return exc.__cause__
    return exc


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
    """An https origin's verification (DLOCK_CA_BUNDLE, else the system store; the client
    certificate, when this process has one); none for http."""
    if scheme != "https":
        return {}
    options: dict[str, Any] = {"cert_reqs": "CERT_REQUIRED", "ca_certs": ca_bundle()}
    client = client_certificate()
    if client:
        options |= {"cert_file": client[0], "key_file": client[1]}
    return options


def _origin(url: str) -> tuple[str, str, int]:
    return _parsed_origin(prefix.group() if (prefix := _ORIGIN_PREFIX.match(url)) else url)


@functools.lru_cache(maxsize=1024)
def _parsed_origin(origin: str) -> tuple[str, str, int]:
    """(scheme, host, port) of an origin, parsed once (a refused one is parsed each time)."""
    parts = urlsplit(origin)
    scheme = parts.scheme or "http"
    if scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {origin!r}")
    return scheme, parts.hostname, parts.port or (443 if scheme == "https" else 80)


def _urllib3_pool(
    scheme: str,
    host: str,
    port: int,
    *,
    size: int,
    keep_alive_s: float | None,
    tls: Mapping[str, Any],
    registry: weakref.WeakSet[Any] | None = None,
) -> HTTPConnectionPool:
    """A pool that never re-sends, never follows a redirect and never makes a thread wait; each
    connection it makes gets `keep_alive_s` and `registry` (urllib3's `conn_kw`)."""
    return (TLSPool if scheme == "https" else Pool)(
        host,
        port,
        maxsize=size,
        block=False,
        retries=False,
        registry=registry,
        keep_alive_s=keep_alive_s,
        **tls,
    )


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
        self.tls: dict[str, Any] = {}
        self._mutex = threading.Lock()
        self.urllib3 = self._new(size)
        _every_pool.add(self)

    def _new(self, size: int) -> HTTPConnectionPool:
        """A new urllib3 pool, with the TLS settings of the environment as it is now."""
        self.tls = _tls_options(self.scheme)
        self._registry: weakref.WeakSet[Any] = weakref.WeakSet()
        return _urllib3_pool(
            self.scheme,
            self.host,
            self.port,
            size=size,
            keep_alive_s=MAX_IDLE_S,
            tls=self.tls,
            registry=self._registry,
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
        return idle_connections(self._registry)

    def close(self) -> None:
        with self._mutex:
            old = self.urllib3
            self.urllib3 = self._new(self.size)
        old.close()


_pools: dict[tuple[str, str, int], ConnectionPool] = {}
_pools_mutex = threading.Lock()
_every_pool: weakref.WeakSet[ConnectionPool] = weakref.WeakSet()
_one_shot: dict[tuple[Any, ...], HTTPConnectionPool] = {}


def one_shot_pool(scheme: str, host: str, port: int, tls: Mapping[str, Any]) -> HTTPConnectionPool:
    """The process's one-shot pool for an origin and TLS settings (a connection serves one
    request, then closes); it keeps 64, else each extra of a burst logs urllib3's "pool full"."""
    key = (scheme, host, port, *sorted(tls.items())) if tls else (scheme, host, port)
    pool = _one_shot.get(key)
    if pool is None:
        with _pools_mutex:
            pool = _one_shot.get(key)
            if pool is None:
                pool = _one_shot[key] = _urllib3_pool(
                    scheme, host, port, size=64, keep_alive_s=None, tls=tls
                )
    return pool


def _forget_after_fork() -> None:
    """In a forked child: never share the parent's connections (or a lock a parent thread held).
    The parent's sockets are dropped, not closed: closing them here could end its requests."""
    global _pools_mutex
    _pools_mutex = threading.Lock()
    _one_shot.clear()
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
        one_shot = list(_one_shot.values())
    for pool in pools:
        pool.close()
    for urllib3_pool in one_shot:
        urllib3_pool.close()
    _one_shot.clear()


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


def _checked(headers: Mapping[str, str]) -> dict[str, str]:
    """The headers as sent; ValueError for a name or value HTTP cannot carry (never written)."""
    out = {name: str(value) for name, value in headers.items()}
    if _BAD_VALUE.search("\t".join(out.values())) or not all(map(_header_name, out)):
        bad = next(n for n, v in out.items() if _BAD_VALUE.search(v) or not _header_name(n))
        raise ValueError(f"header {bad!r} cannot be sent as is")
    return out


def _read_body(response: BaseHTTPResponse) -> bytes:
    """The whole body, within MAX_BODY_BYTES (the connection's deadline bounds the reads).
    Once it is in, urllib3 hands the connection back to its pool."""
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


def discard(response: BaseHTTPResponse) -> None:
    """Close a response read only in part, and its connection (which goes back to its pool
    closed: a slot, never a half-read connection)."""
    response.close()
    response.release_conn()


def request(
    pool: HTTPConnectionPool,
    method: str,
    url: str,
    *,
    body: bytes | None,
    headers: Mapping[str, str],
    connect_s: float,
    read_s: float,
    params: dict[str, Any] | None = None,
) -> tuple[BaseHTTPResponse, bytes]:
    """One request to `url` on a connection of `pool`, and its whole answer. The one place
    `sent` is decided, for exchanges and sends: a header HTTP cannot carry or a
    connect-phase error sent nothing; whatever fails after the connect may have reached the
    server. Never retried, never redirected."""
    try:
        checked = _checked(headers)
        target = _target(url, params)
    except ValueError as exc:  # never written: nothing was sent
        raise TransportError(method, url, sent=False, cause=exc) from exc
    try:
        response = pool.urlopen(
            method,
            target,
            body=body,
            headers=checked,
            retries=NO_RETRY,
            redirect=False,
            timeout=_timeout(connect=connect_s, read=read_s),
            preload_content=False,
        )
    except NOT_SENT_ERRORS as exc:
        raise TransportError(method, url, sent=False, cause=exc) from exc
    except TRANSPORT_ERRORS as exc:
        raise TransportError(method, url, sent=True, cause=exc) from exc
    try:
        return response, _read_body(response)
    except TRANSPORT_ERRORS as exc:
        discard(response)
        raise TransportError(method, url, sent=True, cause=exc) from exc


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
    sent_headers = {"Accept": "application/json", "traceparent": traceparent(trace_id)}
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
    try:
        origin = (pool or pool_for(url)).urllib3
    except ValueError as exc:
        raise TransportError(method, url, sent=False, cause=exc) from exc
    response, raw = request(
        origin,
        method,
        url,
        body=data,
        headers=sent_headers,
        params=params,
        connect_s=hop.connect_s,
        read_s=read_timeout_s if read_timeout_s is not None else hop.read_s,
    )
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
    """One request on a new connection that serves it alone (the rail forward: a kept-alive
    connection could have died before the send), with `Connection: close`. The TLS settings
    are read per call. `read_s` is one deadline for the whole answer."""
    try:
        scheme, host, port = _origin(url)
        pool = one_shot_pool(scheme, host, port, _tls_options(scheme))
    except ValueError as exc:
        raise TransportError(method, url, sent=False, cause=exc) from exc
    headers = {**headers, "Connection": "close"}
    response, raw = request(
        pool, method, url, body=body, headers=headers, connect_s=connect_s, read_s=read_s
    )
    return response.status, response.headers, raw
