"""Streams on dlock's HTTP stack (`dlock.http`): an answer read line by line as it arrives, for
etcd's watches. The request goes through `dlock.http.request` on a one-shot connection of the
origin (the pool's TLS settings and client certificate; its idle connections stay for
`exchange`), with the same `sent` verdict and one read deadline as `exchange`; the connection is
closed when the reader is done, which ends the server's stream. Never retried.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping

from urllib3 import BaseHTTPResponse

from dlock.http import (
    MAX_BODY_BYTES,
    TRANSPORT_ERRORS,
    ConnectionPool,
    TransportError,
    discard,
    pool_for,
    request,
)
from dlock.http_connection import DeadlineSocket


class Stream:
    """An answer read as it arrives (an etcd watch): its status, then its body line by line.
    `close()` closes its connection, which ends the server's stream."""

    def __init__(self, method: str, url: str, response: BaseHTTPResponse) -> None:
        self.method = method
        self.url = url
        self.status = response.status
        self._response = response
        reader = getattr(response.connection, "reader", None)
        self._reader: DeadlineSocket | None = reader
        self._open = True

    def lines(self, *, idle_s: float | None = None) -> Iterator[bytes]:
        """The body's non-empty lines until the server ends it; TransportError(sent=True) when
        the read deadline passes (the one set when the stream opened, or `idle_s` from the
        start of each read when given) or the connection breaks."""
        pending = b""
        while True:
            if idle_s is not None and self._reader is not None:
                self._reader.deadline = time.monotonic() + idle_s
            try:
                chunk = self._response.read1(64 * 1024)
            except TRANSPORT_ERRORS as exc:
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
            discard(self._response)

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
    """Send one request on a one-shot connection of the origin (`pool`'s TLS settings and
    client certificate) and return once the answer's head is in, its body unread: a Stream the
    caller closes. `read_s` is the one deadline for the head and the whole body (the stream's
    life); TransportError as for `exchange` (`sent` False only when the connect failed)."""
    try:
        one_shot = (pool or pool_for(url)).one_shot()
    except ValueError as exc:  # not an http(s) URL: nothing was sent
        raise TransportError(method, url, sent=False, cause=exc) from exc
    response, _ = request(
        one_shot,
        method,
        url,
        body=body,
        headers=headers,
        connect_s=connect_s,
        read_s=read_s,
        stream=True,
    )
    return Stream(method, url, response)
