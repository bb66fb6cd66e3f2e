"""Streams on dlock's HTTP stack (`dlock.http`): an answer read line by line as it arrives, for
etcd's watches. The request goes out on a new connection made by the origin's pool (its TLS
settings and client certificate; the pool's idle connections stay for `exchange`), with the same
`sent` verdict and one read deadline as `exchange`; the connection is closed when the reader is
done, which ends the server's stream. Never retried.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import cast

from urllib3 import BaseHTTPResponse
from urllib3.connection import HTTPConnection
from urllib3.exceptions import HTTPError as Urllib3Error

from dlock.http import (
    _TRANSPORT_ERRORS,
    MAX_BODY_BYTES,
    ConnectionPool,
    TransportError,
    _BoundedSocket,
    _checked,
    _round_trip,
    _target,
    pool_for,
)


class Stream:
    """An answer read as it arrives (an etcd watch): its status, then its body line by line.
    `close()` closes its connection, which ends the server's stream."""

    def __init__(
        self,
        method: str,
        url: str,
        response: BaseHTTPResponse,
        conn: HTTPConnection,
        sock: _BoundedSocket,
    ) -> None:
        self.method = method
        self.url = url
        self.status = response.status
        self._response = response
        self._conn = conn
        self._sock = sock
        self._open = True

    def lines(self, *, idle_s: float | None = None) -> Iterator[bytes]:
        """The body's non-empty lines until the server ends it; TransportError(sent=True) when
        the read deadline passes (the one set when the stream opened, or `idle_s` from the
        start of each read when given) or the connection breaks."""
        pending = b""
        while True:
            if idle_s is not None:
                self._sock.deadline = time.monotonic() + idle_s
            try:
                chunk = self._response.read1(64 * 1024)
            except _TRANSPORT_ERRORS as exc:
                raise TransportError(self.method, self.url, sent=True, cause=exc) from exc
            if not chunk:
                if pending.strip():
                    yield pending
                return
            pending += chunk
            if len(pending) > MAX_BODY_BYTES:
                raise TransportError(
                    self.method, self.url, sent=True, cause=ValueError("line too large")
                )
            *complete, pending = pending.split(b"\n")
            for line in complete:
                if line.strip():
                    yield line

    def close(self) -> None:
        if self._open:
            self._open = False
            self._response.close()
            self._conn.close()

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_stream(
    method: str,
    url: str,
    *,
    connect_s: float,
    read_s: float,
    body: bytes,
    headers: Mapping[str, str],
    pool: ConnectionPool | None = None,
) -> Stream:
    """Send one request on a new connection made by the origin's pool (its TLS settings, its
    client certificate; the pool's idle connections stay for `exchange`) and return once the
    answer's head is in, its body unread: a Stream the caller closes. `read_s` is the one
    deadline for the head and the whole body (the stream's life); TransportError as for
    `exchange` (`sent` False only when the connect failed). Never retried."""
    try:
        checked = _checked({"Accept-Encoding": "identity", **headers})
        target = _target(url, None)
        conn = cast(HTTPConnection, (pool or pool_for(url)).urllib3._new_conn())
    except (ValueError, Urllib3Error) as exc:  # never written: nothing was sent
        raise TransportError(method, url, sent=False, cause=exc) from exc
    response, _, sock = _round_trip(
        conn,
        method,
        url,
        target=target,
        body=body,
        headers=checked,
        connect_s=connect_s,
        read_s=read_s,
        whole=False,
    )
    return Stream(method, url, response, conn, sock)
