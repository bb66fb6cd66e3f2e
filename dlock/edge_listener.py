"""Where the role's proxy sends one datagram per answer it made itself: a UDP socket on
127.0.0.1:PROXY_EVENTS_PORT, bound once by the gunicorn master (`listen`, its `on_starting`
hook in settings/gunicorn.py), so the port is held for as long as the role runs, and read in
every worker forked from it (`read_in_child`, from its `post_worker_init` hook), which starts
the worker's reading thread (dlock.edge_events). Apart from dlock.edge_events because the
master must not import the metrics: a labelled series made there would be one more process's
file in prometheus_client's multiprocess directory.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

PORT_ENV = "PROXY_EVENTS_PORT"
# Asked of the kernel; it grants at most net.core.rmem_max (twice that, with its bookkeeping).
RECEIVE_BUFFER_BYTES = 256 * 1024

_bound: list[socket.socket] = []


def configured_port(environ: Mapping[str, str] | None = None) -> int | None:
    """PROXY_EVENTS_PORT, or None when unset or empty (no proxy events: a role run bare)."""
    raw = (os.environ if environ is None else environ).get(PORT_ENV, "")
    if not raw:
        return None
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        raise ValueError(f"{PORT_ENV}={raw!r}: want a UDP port number")
    return int(raw)


def listen(server: object = None) -> None:
    """gunicorn `on_starting` (the master, once): bind PROXY_EVENTS_PORT when it is set. A port
    that cannot be bound stops the role from starting (its proxy would count into nothing)."""
    port = configured_port()
    if port is None or _bound:
        return
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER_BYTES)
    sock.bind(("127.0.0.1", port))
    _bound.append(sock)


def read_in_child(worker: object = None) -> None:
    """In each worker once it is initialised (gunicorn's `post_worker_init`: its signal handlers
    are installed; a SIGTERM before that, while `post_fork` ran, is lost to it, and the import
    below widened that window): start reading the socket the master bound, if it bound one.
    Datagrams sent meanwhile wait in the socket's buffer."""
    if not _bound:
        return
    from dlock import edge_events  # a worker's import of the metrics, never the master's

    edge_events.start(_bound[0])
