"""dlock's connections under urllib3's pools (the pools' documented `ConnectionCls` hook): the
connect phase, one read deadline per response, and how long an idle connection may be reused.

- **Connect phase**: every failure of `connect()` is raised as one of urllib3's connect-phase
  types (`ConnectTimeoutError`, `NewConnectionError`), the TLS handshake's ssl errors and
  timeouts included, so `dlock.http.request` can tell "nothing was written" by type alone.
- **One read deadline per response**: `read_s` (urllib3's read timeout, which it sets on the
  connection before it asks for the response) bounds the whole answer, head and body, from the
  moment the request is written, not each read: a peer that trickles its answer cannot stretch
  it (`DeadlineSocket`, the socket wrapped on connect: each read sets what is left of it).
- **Reuse**: `keep_alive_s` is how long after its last answer a connection may serve another
  request (urllib3 asks `is_connected` before it reuses one; False makes it close the
  connection and connect anew); None makes a one-shot connection, whose socket is closed as
  soon as its answer has been read.
"""

from __future__ import annotations

import io
import time
import weakref
from collections.abc import Callable
from typing import Any

from urllib3 import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.exceptions import ConnectTimeoutError, NewConnectionError
from urllib3.exceptions import HTTPError as Urllib3Error

# The socket's methods urllib3 and http.client call on every request.
_PER_REQUEST = ("sendall", "fileno", "shutdown", "close")
# The set of a pool's connections (`ConnectionPool.idle`), if it keeps one.
Registry = weakref.WeakSet[Any] | None


class DeadlineSocket:
    """A connected socket as urllib3 and http.client see it, except that the reader http.client
    makes from it (`makefile`) keeps the current response's `deadline`. `busy` is True from a
    request's answer until it has been read; `used_at` is when the last answer ended."""

    __slots__ = ("sock", "keep_alive_s", "deadline", "used_at", "busy", *_PER_REQUEST)

    def __init__(self, sock: Any, *, keep_alive_s: float | None) -> None:
        self.sock = sock
        for name in _PER_REQUEST:  # bound once, not looked up through __getattr__ per request
            setattr(self, name, getattr(sock, name))
        self.keep_alive_s = keep_alive_s
        self.deadline: float | None = None  # monotonic: the whole response must be in by then
        self.used_at = time.monotonic()
        self.busy = False

    def reusable(self) -> bool:
        """Whether it may serve another request now (idle within its keep-alive; not one-shot)."""
        limit = self.keep_alive_s
        return limit is not None and time.monotonic() - self.used_at <= limit

    def settimeout(self, value: float | None) -> None:
        if not (self.busy and self.deadline is not None):  # else each read sets what is left
            self.sock.settimeout(value)

    def makefile(self, mode: str = "rb", *args: Any, **kwargs: Any) -> io.BufferedReader:
        return io.BufferedReader(_DeadlineIO(self.sock.makefile("rb", buffering=0), self))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sock, name)


class _DeadlineIO(io.RawIOBase):
    """The socket's reader with the response's deadline: every read waits at most for what is
    left of it, and none starts after it. http.client reads the head and body through this, and
    closes it when the answer is complete."""

    def __init__(self, raw: io.RawIOBase, owner: DeadlineSocket) -> None:
        self._raw = raw
        self._owner = owner

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int | None:
        deadline = self._owner.deadline
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the response did not complete within the read budget")
            self._owner.sock.settimeout(left)
        # `_raw` (the socket's reader: a reference, like http.client's) is kept for its close.
        return self._owner.sock.recv_into(buffer)

    def close(self) -> None:
        if not self.closed:
            self._owner.busy = False
            self._owner.used_at = time.monotonic()
        self._raw.close()
        if self._owner.keep_alive_s is None:
            self._owner.sock.close()  # one-shot: the answer is in, no idle socket is left
        super().close()


def _connect(conn: HTTPConnection, connect: Callable[[], None], keep_alive_s: float | None) -> None:
    """`connect` (urllib3's), every failure raised as a urllib3 connect-phase type (nothing was
    written yet), and the socket wrapped for the read deadline."""
    try:
        connect()
    except ConnectTimeoutError:
        conn.close()
        raise
    except TimeoutError as exc:  # the TLS handshake's
        conn.close()
        raise ConnectTimeoutError(conn, f"TLS handshake with {conn.host} timed out") from exc
    except (OSError, ValueError, Urllib3Error) as exc:
        conn.close()
        raise NewConnectionError(conn, f"connection to {conn.host} failed: {exc}") from exc
    conn.sock = DeadlineSocket(conn.sock, keep_alive_s=keep_alive_s)


def _answer_due(conn: HTTPConnection) -> None:
    """Start the response's deadline (urllib3 has set the timeout to the read budget by now)."""
    sock = conn.sock
    if not isinstance(sock, DeadlineSocket):
        return
    sock.busy = True
    if isinstance(conn.timeout, (int, float)):
        sock.deadline = time.monotonic() + conn.timeout


class Connection(HTTPConnection):
    """urllib3's HTTP connection with dlock's connect phase, read deadline and reuse limit.
    Each connection joins the `registry` its pool was given, if any."""

    def __init__(
        self, *args: Any, keep_alive_s: float | None, registry: Registry = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.keep_alive_s = keep_alive_s
        if registry is not None:
            registry.add(self)

    def connect(self) -> None:
        _connect(self, super().connect, self.keep_alive_s)

    def getresponse(self) -> Any:
        _answer_due(self)
        return super().getresponse()

    @property
    def is_connected(self) -> bool:
        sock = self.sock
        return isinstance(sock, DeadlineSocket) and sock.reusable() and super().is_connected


class TLSConnection(Connection, HTTPSConnection):
    """`Connection` for https origins: its changes over urllib3's verified TLS connection (the
    method order puts HTTPSConnection under Connection, so its connect does the handshake)."""


class Pool(HTTPConnectionPool):
    """urllib3's pool of dlock's `Connection`s."""

    ConnectionCls = Connection


class TLSPool(HTTPSConnectionPool):
    """urllib3's verified-TLS pool of dlock's `TLSConnection`s."""

    ConnectionCls = TLSConnection


def idle_connections(registry: weakref.WeakSet[Any]) -> int:
    """Connections of a `registry` open and not answering a request (tests, diagnostics)."""
    return sum(
        1 for conn in list(registry) if isinstance(conn.sock, DeadlineSocket) and not conn.sock.busy
    )
