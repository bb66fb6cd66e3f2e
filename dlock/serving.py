"""gunicorn worker for every server role: graceful drain, and the thread-queue clock.

Drain: stop accepting at once, finish in-flight work, then exit.

Stock gunicorn already drains in-flight requests on SIGTERM, but the worker keeps its copy of
the listening socket open until the drain ends, so the kernel keeps completing handshakes that
nobody will serve (the client sees a connection, then a reset). And SIGINT is a quick shutdown.
Here both SIGTERM and SIGINT mean: close the listener now (new connections are refused), let
requests already accepted run to completion within `graceful_timeout`, then exit.

Arrival clock: before a request reaches Django it waits in the socket's receive buffer until
the worker's main loop (which competes for the GIL with every busy request thread) notices it,
then in the thread pool's unbounded queue; no database deadline can see either wait. Under
overload they grow without bound (a 2x open-loop load test measured 12 s medians and client
timeouts). The thread that picks a request up publishes how long ago it arrived
(`thread_queue_wait`): the kernel's receive timestamp of the request's first unread byte
(SO_TIMESTAMP, read with a 1-byte MSG_PEEK), or when the main loop queued it if the kernel has
none; `dlock.admission` answers 503 OVERLOADED at once when that exceeds SERVER_QUEUE_DEADLINE_MS.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import struct
import threading
import time

from gunicorn import util
from gunicorn.workers.gthread import ThreadWorker

from dlock.errors import ApiError, Code
from dlock.tracing import new_trace_id
from dlock.wire import raw_json_headers

_picked_up = threading.local()
ACCEPT_BATCH = 64
SO_TIMESTAMP = getattr(socket, "SO_TIMESTAMP", 29)  # Linux; not exported by every Python
_TIMEVAL = struct.Struct("ll")


def thread_queue_wait() -> float | None:
    """Seconds since the current request arrived, when it reached a worker thread; None outside
    gunicorn."""
    return getattr(_picked_up, "waited", None)


def arrived_seconds_ago(sock: socket.socket) -> float | None:
    """How long ago the unread head of `sock`'s receive queue arrived, by the kernel's receive
    timestamp (needs SO_TIMESTAMP on the socket); None when there is no data or no stamp."""
    try:
        _, ancillary, _, _ = sock.recvmsg(1, 64, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except (OSError, NotImplementedError):  # nothing buffered (EAGAIN), peer gone, or TLS
        return None
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMP and len(data) >= _TIMEVAL.size:
            seconds, micros = _TIMEVAL.unpack(data[: _TIMEVAL.size])
            ago = time.time() - (seconds + micros / 1e6)
            return ago if 0 <= ago < 3600 else None  # the wall clock stepped: use the other
    return None


def write_envelope_error(sock, status_int: int, reason: str, mesg: str) -> None:
    """gunicorn's own error answers (a request line or headers it cannot parse, over its limits,
    a worker failure outside the app) as the C3 envelope instead of an HTML page.

    Replaces `gunicorn.util.write_error`, which the worker's `handle_error` calls after choosing
    the status (400, 414 URI too long, 431 header fields too large, 501, 500, ...).
    """
    if status_int < 500 or status_int == 501:  # 501: a transfer coding the client chose
        error = ApiError(Code.VALIDATION_FAILED, mesg or reason)
    else:
        error = ApiError(Code.INTERNAL, "internal error; see the service log")
    body = error.envelope_bytes(new_trace_id())
    headers = {"Connection": "close", **raw_json_headers(body)}
    head = f"HTTP/1.1 {status_int} {reason}\r\n" + "".join(
        f"{name}: {value}\r\n" for name, value in headers.items()
    )
    util.write_nonblock(sock, head.encode("latin-1") + b"\r\n" + body)


class DrainingThreadWorker(ThreadWorker):
    def init_process(self) -> None:
        util.write_error = write_envelope_error  # in the worker process only (see above)
        super().init_process()

    def accept(self, listener) -> None:
        """Take every connection already waiting, not one per poller wake-up.

        Under load the main loop competes for the GIL with every busy request thread, so each
        wake-up is expensive; accepting one connection per wake-up let the kernel backlog
        overflow (clients then hang in SYN retries) long before the threads were the limit.
        """
        for _ in range(ACCEPT_BATCH):
            if self.nr_conns >= self.worker_connections:
                return
            before = self.nr_conns
            super().accept(listener)
            if self.nr_conns == before:  # EAGAIN: the backlog is empty
                return

    def enqueue_req(self, conn) -> None:
        conn.dlock_queued_at = time.monotonic()
        if not getattr(conn, "dlock_stamped", False):
            conn.dlock_stamped = True  # from now on the kernel stamps what arrives
            with contextlib.suppress(OSError):
                conn.sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMP, 1)
        super().enqueue_req(conn)

    def handle(self, conn):
        waits = []
        queued_at = getattr(conn, "dlock_queued_at", None)
        if queued_at is not None:
            waits.append(time.monotonic() - queued_at)
        arrived = arrived_seconds_ago(conn.sock)
        if arrived is not None:
            waits.append(arrived)
        _picked_up.waited = max(waits) if waits else None
        try:
            return super().handle(conn)
        finally:
            _picked_up.waited = None

    def init_signals(self) -> None:
        super().init_signals()
        signal.signal(signal.SIGINT, self.handle_exit)  # Ctrl-C on the group: drain, too
        signal.siginterrupt(signal.SIGINT, False)

    def handle_exit(self, sig, frame) -> None:
        if self.alive:
            # Runs in the main loop, not in the signal handler: the poller is not re-entrant.
            self.method_queue.defer(self._close_listeners)
        super().handle_exit(sig, frame)

    def _close_listeners(self) -> None:
        self.set_accept_enabled(False)
        for listener in self.sockets:
            listener.close()
        self.log.info("draining: listener closed, %s connection(s) in flight", self.nr_conns)


def drain_on_sigint(arbiter) -> None:
    """gunicorn `when_ready` hook: the master treats SIGINT like SIGTERM (graceful stop)."""
    arbiter.handle_int = arbiter.handle_term
