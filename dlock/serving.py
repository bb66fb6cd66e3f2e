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
(`thread_queue_wait`): the kernel's receive timestamp (SO_TIMESTAMP) of the bytes that
completed the request, read by the arrival path below, or when the main loop queued it if the
kernel has none; `dlock.admission` answers 503 OVERLOADED at once when that exceeds
SERVER_QUEUE_DEADLINE_MS.

Arrival path: no thread waits for a client. Stock gthread hands a connection to a pool thread as
soon as a byte arrives, and the thread then blocks reading the rest, so 17 sockets sending half a
request line (or a byte a second) held every thread of a role and its liveness probe timed out.
Here the main loop reads each request (head and Content-Length body) without blocking, and only
a complete one reaches a thread. A request not complete within SERVER_HEADER_TIMEOUT_MS of its
first byte (of the accept, on a new connection) is closed with 408, whatever its pace; a body cut
short by the client's half-close is 400 and never executed; unknown methods are 501, chunked
bodies 411 and oversized ones 413, all before Django. `/health/*` and `/metrics` run on a small
pool of their own, so probes are answered whatever the request threads are doing. A connection
that is done lingers for the client's FIN in the poller, not in a blocking read of the main loop.

Per-request cost (issue 18; gunicorn's own work is about a quarter of every role's CPU, measured
by bench/worker.py, numbers in docs/benchmarks.md). A kept-alive connection is handed back to the
poller by the thread that served it, not by a wake-up of the main loop through gunicorn's pipe,
and stays registered from then until its next request is complete: the main loop reads that
request straight from the readiness callback (no unregister / register in between). gunicorn's
Config is read through a snapshot (one dict lookup and property per access otherwise, many per
request), and the arbiter's heartbeat file is touched at most every HEARTBEAT_INTERVAL_S, not on
every loop turn (the arbiter's `timeout` is 60 s: a stuck loop is still killed).
"""

from __future__ import annotations

import contextlib
import email.utils
import selectors
import signal
import socket
import struct
import threading
import time
from collections import OrderedDict
from concurrent import futures
from functools import partial
from typing import TYPE_CHECKING, Any

from gunicorn import util
from gunicorn.http import wsgi as gunicorn_wsgi
from gunicorn.workers.gthread import STOP_KEEPALIVE_LINGER, ThreadWorker

from dlock.errors import ApiError, Code
from dlock.tracing import new_trace_id
from dlock.wire import KNOWN_METHODS, MONITORING_PATHS, raw_json_headers

if TYPE_CHECKING:
    from types import FrameType

    from gunicorn.arbiter import Arbiter
    from gunicorn.config import Config
    from gunicorn.sock import BaseSocket
    from gunicorn.workers.gthread import TConn

_picked_up = threading.local()
ACCEPT_BATCH = 64
SO_TIMESTAMP = getattr(socket, "SO_TIMESTAMP", 29)  # Linux; not exported by every Python
_TIMEVAL = struct.Struct("ll")
RECV_CHUNK = 65536
MONITORING_THREADS = 2
# Used when Django's settings are not available (they are, once the worker loaded the app).
DEFAULT_HEADER_TIMEOUT_MS = 3_000
DEFAULT_MAX_BODY_BYTES = 64 * 1024
# The arbiter kills a worker whose heartbeat file is older than `timeout` (60 s here); touching
# it on every loop turn was a syscall per request or two.
HEARTBEAT_INTERVAL_S = 0.5
# gunicorn's close_graceful: after the FIN, read (and drop) what the client still sends, for up
# to this long and this many bytes, so the kernel does not answer it with a reset.
LINGER_S = 2.0
LINGER_MAX_BYTES = 65536


def thread_queue_wait() -> float | None:
    """Seconds since the current request arrived, when it reached a worker thread; None outside
    gunicorn."""
    return getattr(_picked_up, "waited", None)


def arrived_seconds_ago(sock: socket.socket) -> float | None:
    """How long ago the unread head of `sock`'s receive queue arrived, by the kernel's receive
    timestamp (needs SO_TIMESTAMP on the socket); None when there is no data, or the kernel does
    not stamp (some sandboxed network stacks never do: the caller falls back to its own clock)."""
    try:
        _, ancillary, _, _ = sock.recvmsg(1, 64, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except (OSError, NotImplementedError):  # nothing buffered (EAGAIN), peer gone, or TLS
        return None
    stamp = kernel_stamp(ancillary)
    return None if stamp is None else time.time() - stamp


def kernel_stamp(ancillary: list[tuple[int, int, bytes]]) -> float | None:
    """Wall-clock receive time of the first byte of a `recvmsg` (SO_TIMESTAMP), if stamped; None
    also when the stamp is in the future or over an hour old (the wall clock stepped)."""
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMP and len(data) >= _TIMEVAL.size:
            seconds, micros = _TIMEVAL.unpack(data[: _TIMEVAL.size])
            stamp = seconds + micros / 1e6
            return stamp if 0 <= time.time() - stamp < 3600 else None
    return None


def write_envelope_error(sock: socket.socket, status_int: int, reason: str, mesg: str) -> None:
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


class ConfigSnapshot:
    """gunicorn's Config as the worker reads it: each setting looked up once, then a plain
    attribute. Config resolves every read through `__getattr__` (a dict lookup and the setting's
    `get`, some of them properties that rebuild their value); the request path reads a dozen per
    request. A worker's settings never change (a reload starts new workers), so the first value
    read is the value. Unknown names raise AttributeError as Config does."""

    def __init__(self, live: Config) -> None:
        self._live = live

    def __getattr__(self, name: str) -> Any:  # only for names not read before
        value = getattr(self._live, name)
        self.__dict__[name] = value
        return value


_date_cache: tuple[int, str] = (-1, "")


def http_date(timestamp: float | None = None) -> str:
    """gunicorn's `util.http_date` (the Date header of every response), formatted once per
    second: the format has whole seconds, so the text is the same as formatting it each time."""
    global _date_cache
    second = int(time.time() if timestamp is None else timestamp)
    cached_second, text = _date_cache
    if cached_second != second:
        text = email.utils.formatdate(second, localtime=False, usegmt=True)
        _date_cache = (second, text)  # one tuple: a reader in another thread sees old or new
    return text


class _HeldWrite:
    """Stands in for the socket while gunicorn writes a response head: keeps the bytes."""

    __slots__ = ("data",)

    def __init__(self) -> None:
        self.data = b""

    def sendall(self, data: bytes) -> None:
        self.data += data


class OneWriteResponse(gunicorn_wsgi.Response):
    """gunicorn's HTTP/1 response, its head sent in the same write as the first body bytes.

    gunicorn writes the head, then each body chunk: two sends (and two loopback segments for
    the client to take in) for the one-chunk JSON answers every role gives. The head gunicorn
    builds is held (not rebuilt here) and goes out with the first body chunk, or on its own
    when there is none (HEAD, 204, 304, an empty iterable), before the chunked terminator or a
    sendfile. Installed in the worker process only (`init_process`)."""

    held_head: bytes | None = None
    hold = True

    def send_headers(self) -> None:
        if self.headers_sent or not self.hold:
            super().send_headers()
            return
        sock, held = self.sock, _HeldWrite()  # type: ignore[has-type]
        self.sock = held
        try:
            super().send_headers()
        finally:
            self.sock = sock
        self.held_head = held.data

    def _flush_head(self) -> None:
        head, self.held_head = self.held_head, None
        if head:
            util.write(self.sock, head)

    def _emit_body(self, data: bytes) -> None:
        head = self.held_head
        if head and not self.chunked:
            self.held_head = None
            util.write(self.sock, head + data)
            return
        self._flush_head()
        super()._emit_body(data)

    def sendfile(self, respiter: Any) -> bool:
        self.hold = False
        self._flush_head()
        return super().sendfile(respiter)

    def close(self) -> None:
        self.hold = False
        self._flush_head()
        super().close()


class _Incomplete(Exception):
    """The buffered bytes are not a whole request yet."""


class _Refused(Exception):
    """The request is answered from the arrival path (status, reason, message) and closed."""


def _request_complete(buf: bytes | bytearray, *, max_head: int, max_body: int) -> str:
    """Decide from the buffered bytes whether a whole request has arrived.

    Returns the request path when the head and its Content-Length body are all buffered;
    raises `_Incomplete` while bytes are missing and `_Refused` for what is answered at once.
    Only the framing is read here: gunicorn's parser still parses (and refuses) the head.
    Runs in the main loop for every request: the header block is lower-cased once and only the
    lines that can matter (Content-Length, Transfer-Encoding, Expect) are split out.
    """
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        if len(buf) > max_head:
            raise _Refused(431, "Request Header Fields Too Large", "request head too large")
        raise _Incomplete
    line_end = buf.find(b"\r\n", 0, end)
    if line_end < 0:
        line_end = end
    parts = bytes(buf[:line_end]).split(b" ")
    if len(parts) != 3 or not parts[0].isalpha() or not parts[2].startswith(b"HTTP/"):
        return ""  # not a request line: gunicorn's parser answers 400 before any body
    method, target = parts[0], parts[1]
    if method.decode("latin-1") not in KNOWN_METHODS:
        raise _Refused(501, "Not Implemented", "method not implemented")
    length = 0
    expects_continue = False
    fields = bytes(buf[line_end:end]).lower()
    if b"content-length" in fields or b"transfer-encoding" in fields or b"expect" in fields:
        for line in fields.split(b"\r\n"):
            name, _, value = line.partition(b":")
            name, value = name.strip(), value.strip()
            if name == b"expect" and value == b"100-continue":
                expects_continue = True
            if name == b"transfer-encoding" and value not in (b"", b"identity"):
                raise _Refused(
                    411,
                    "Length Required",
                    "chunked request bodies are not accepted; send Content-Length",
                )
            if name == b"content-length":
                if not value.isdigit():
                    return ""  # gunicorn's parser refuses it (400) without reading a body
                length = int(value)
    if length > max_body:
        raise _Refused(413, "Content Too Large", f"request body exceeds {max_body} bytes")
    if len(buf) < end + 4 + length:
        raise _Incomplete(expects_continue)
    return target.split(b"?", 1)[0].decode("latin-1")


class DrainingThreadWorker(ThreadWorker):
    def init_process(self) -> None:
        util.write_error = write_envelope_error  # in the worker process only (see above)
        gunicorn_wsgi.Response = OneWriteResponse  # wsgi.create looks it up per request
        util.http_date = http_date
        self.cfg = ConfigSnapshot(self.cfg)  # type: ignore[has-type]
        self.is_ssl = self.cfg.is_ssl
        self.next_heartbeat = 0.0
        # Connections whose request is still arriving, oldest deadline first.
        self.arrivals: OrderedDict[int, Any] = OrderedDict()  # gunicorn TConn
        # Closing connections lingering for the client's FIN: id -> (conn, deadline, bytes read).
        self.lingering: OrderedDict[int, list[Any]] = OrderedDict()
        self.monitoring_pool = futures.ThreadPoolExecutor(
            max_workers=MONITORING_THREADS, thread_name_prefix="dlock-monitoring"
        )
        super().init_process()

    def load_wsgi(self) -> None:
        super().load_wsgi()
        try:  # the app configured Django; the probe and role settings both define these
            from django.conf import settings

            timeout_ms = settings.SERVER_HEADER_TIMEOUT_MS
            max_body = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        except Exception:  # not a Django app (a bench arm): keep the defaults
            timeout_ms, max_body = DEFAULT_HEADER_TIMEOUT_MS, DEFAULT_MAX_BODY_BYTES
        self.header_timeout = timeout_ms / 1000
        self.max_body = max_body
        line = self.cfg.limit_request_line or 8190
        fields = (self.cfg.limit_request_fields or 100) * (
            (self.cfg.limit_request_field_size or 8190) + 2
        )
        self.max_head = line + 2 + fields + 2

    def accept(self, listener: BaseSocket) -> None:
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

    # ---------------------------------------------------------------- arrival path (main loop)

    def enqueue_req(self, conn: TConn) -> None:
        """Every way a connection reaches the pool (new, kept alive, read-ahead) comes here:
        only a complete request is handed to a thread."""
        if self.is_ssl:  # TLS terminates in front of dlock; stock behaviour if it does not
            self._submit(conn, self.tpool)
            return
        if getattr(conn, "dlock_complete", False):
            conn.dlock_complete = False
            self._submit(conn, self.monitoring_pool if conn.dlock_monitoring else self.tpool)
            return
        self._start_arrival(conn)

    def _submit(self, conn: TConn, pool: futures.Executor) -> None:
        conn.dlock_queued_at = time.monotonic()
        fs = pool.submit(self.handle, conn)
        fs.add_done_callback(partial(self._served, conn))

    def _served(self, conn: TConn, fut: futures.Future) -> None:
        """Runs in the thread that served `conn` (or in the main loop, if it was done first).

        A connection kept alive with nothing read ahead goes back to the poller from here, to
        wait for its next request; anything else (closing it, read-ahead bytes, a stopping
        worker) is `finish_request` in the main loop, as before. The connection is
        in the keep-alive queue before the poller can report it, and no other thread touches
        it until the poller does (epoll and the selector's fd map take a registration from
        any thread; the main loop only ever unregisters what it was handed).
        """
        if (
            not self.alive
            or self.is_ssl
            or fut.cancelled()
            or fut.exception() is not None
            or fut.result() is not True
            or conn.parser.unreader.buf.getvalue()
        ):
            self.method_queue.defer(self.finish_request, conn, fut)
            return
        conn.sock.setblocking(False)
        conn.set_timeout()
        conn.dlock_kept = True
        self.keepalived_conns.append(conn)
        if not self.alive:  # the drain began meanwhile: linger as finish_request would
            conn.timeout = min(conn.timeout, time.monotonic() + STOP_KEEPALIVE_LINGER)
        with contextlib.suppress(OSError, ValueError):  # closed by the final cleanup of a stop
            self.poller.register(conn.sock, selectors.EVENT_READ, partial(self._on_arrival, conn))

    def finish_request(self, conn: TConn, fs: futures.Future) -> None:
        """gunicorn's, but a connection that is done lingers without blocking the main loop.

        gunicorn closes it with `util.close_graceful` right here: FIN, then a blocking read
        until the client closes, up to 2 s, in the main loop. A client that asked for
        `Connection: close` and then neither read nor closed held every accept, arrival and
        probe of the worker for those 2 s (five of them for 10 s). Here the read-until-FIN is
        the poller's: the same bytes are drained, for the same time, and the connection still
        counts against worker_connections until it is closed."""
        if self.is_ssl or (not fs.cancelled() and fs.exception() is None and fs.result()):
            super().finish_request(conn, fs)  # kept alive, deferred, or TLS: gunicorn's own
            return
        try:
            conn.sock.shutdown(socket.SHUT_WR)
            conn.sock.setblocking(False)
            self.poller.register(conn.sock, selectors.EVENT_READ, partial(self._on_linger, conn))
        except (OSError, ValueError, KeyError):  # already gone: close at once
            self._end_linger(conn)
            return
        self.lingering[id(conn)] = [conn, time.monotonic() + LINGER_S, 0]

    def _on_linger(self, conn: TConn, _fileobj: socket.socket) -> None:
        entry = self.lingering.get(id(conn))
        try:
            data = conn.sock.recv(RECV_CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if data and entry is not None:
            entry[2] += len(data)
            if entry[2] < LINGER_MAX_BYTES:
                return
        self._end_linger(conn)

    def _end_linger(self, conn: TConn) -> None:
        self.lingering.pop(id(conn), None)
        self._drop(conn)

    def _cap_keepalive(self, deadline: float) -> None:
        # A serving thread may append meanwhile: iterate over a copy (taken in one C call).
        for conn in tuple(self.keepalived_conns):
            conn.timeout = min(conn.timeout, deadline)

    def notify(self) -> None:
        """The arbiter's heartbeat, at most every HEARTBEAT_INTERVAL_S (see the module doc)."""
        now = time.monotonic()
        if now >= self.next_heartbeat:
            self.next_heartbeat = now + HEARTBEAT_INTERVAL_S
            super().notify()

    def _start_arrival(self, conn: TConn) -> None:
        if not getattr(conn, "dlock_stamped", False):
            conn.dlock_stamped = True  # from now on the kernel stamps what arrives
            with contextlib.suppress(OSError):
                conn.sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMP, 1)
        conn.sock.setblocking(False)
        # Bytes a previous request's parser read ahead belong to this one.
        ahead = conn.parser.unreader.take_buffered() if conn.parser is not None else b""
        self._open_arrival(conn, ahead)
        self.poller.register(conn.sock, selectors.EVENT_READ, partial(self._on_arrival, conn))
        if ahead:
            self._examine(conn, eof=False)
        else:
            self._on_arrival(conn, conn.sock)  # a new connection's bytes are often there already

    def _on_arrival(self, conn: TConn, _fileobj: socket.socket) -> None:
        try:
            data, ancillary, _, _ = conn.sock.recvmsg(RECV_CHUNK, 64)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = None
        if getattr(conn, "dlock_kept", False):  # a kept-alive connection's next request begins
            self._wake_kept(conn)
        if data is None:
            self._end_arrival(conn)
            return
        if data:  # the queue clock starts when the bytes that complete the request arrived
            conn.dlock_arrived = kernel_stamp(ancillary) or time.time()
        conn.dlock_buf += data
        self._examine(conn, eof=not data)

    def _wake_kept(self, conn: TConn) -> None:
        """A kept-alive connection turned readable: it leaves the keep-alive queue and its
        request is an arrival from now (it stays registered with the poller, same callback)."""
        conn.dlock_kept = False
        self.keepalived_conns.remove(conn)
        self._open_arrival(conn)

    def _open_arrival(self, conn: TConn, ahead: bytes = b"") -> None:
        """The connection's next request arrives from now: its buffer (starting with what was
        read ahead), its clocks, and its place in the arrival queue (oldest deadline first)."""
        conn.dlock_buf = bytearray(ahead)
        conn.dlock_arrived = time.time() if ahead else None
        conn.dlock_deadline = time.monotonic() + self.header_timeout
        conn.dlock_continued = False
        self.arrivals[id(conn)] = conn

    def _examine(self, conn: TConn, *, eof: bool) -> None:
        try:
            path = _request_complete(conn.dlock_buf, max_head=self.max_head, max_body=self.max_body)
        except _Incomplete as incomplete:
            if incomplete.args and incomplete.args[0] and not getattr(conn, "dlock_continued", 0):
                conn.dlock_continued = True  # the client waits for this before its body
                with contextlib.suppress(OSError):
                    conn.sock.send(b"HTTP/1.1 100 Continue\r\n\r\n")
            if eof and conn.dlock_buf:
                # The client half-closed mid-request: what arrived must not be executed.
                self._end_arrival(
                    conn,
                    answer=(
                        400,
                        "Bad Request",
                        "request ended before its head or body was complete",
                    ),
                )
            elif eof:
                self._end_arrival(conn)  # an idle connection closed by the client
            return
        except _Refused as refused:
            self._end_arrival(conn, answer=refused.args)
            return
        del self.arrivals[id(conn)]
        self.poller.unregister(conn.sock)
        conn.dlock_monitoring = path in MONITORING_PATHS
        conn.dlock_complete = True
        self.enqueue_req(conn)

    def _end_arrival(self, conn: TConn, answer: tuple | None = None) -> None:
        self.arrivals.pop(id(conn), None)
        self._drop(conn, answer)

    def _drop(self, conn: TConn, answer: tuple | None = None) -> None:
        """Off the poller, the envelope `answer` (status, reason, message) if any, closed."""
        with contextlib.suppress(KeyError, ValueError, OSError):
            self.poller.unregister(conn.sock)
        if answer is not None:
            with contextlib.suppress(OSError):
                write_envelope_error(conn.sock, *answer)
        self.nr_conns -= 1
        conn.close()

    def murder_pending(self) -> None:
        super().murder_pending()
        now = time.monotonic()
        while self.lingering:
            conn, deadline, _ = next(iter(self.lingering.values()))
            if deadline > now:
                break
            self._end_linger(conn)
        while self.arrivals:
            conn = next(iter(self.arrivals.values()))
            if conn.dlock_deadline > now:
                break
            self._end_arrival(
                conn,
                answer=(
                    408,
                    "Request Timeout",
                    f"request not complete within {round(self.header_timeout * 1000)} ms",
                ),
            )

    # ---------------------------------------------------------------- worker threads

    def handle(self, conn: TConn) -> object:
        # gunicorn's verdict: keep the connection alive (bool), or its defer sentinel
        buf = getattr(conn, "dlock_buf", None)
        if buf is not None:  # the arrival path read the whole request: give it to the parser
            conn.dlock_buf = None
            conn.data_ready = True
            conn.init()  # the socket is made blocking by init (a new connection) or by gunicorn
            conn.parser.unreader.unread(bytes(buf))
        waits = []
        queued_at = getattr(conn, "dlock_queued_at", None)
        if queued_at is not None:
            waits.append(time.monotonic() - queued_at)
        arrived = getattr(conn, "dlock_arrived", None)
        if arrived is not None:
            waits.append(max(0.0, time.time() - arrived))
        elif self.is_ssl:
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

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.alive:
            # Runs in the main loop, not in the signal handler: the poller is not re-entrant.
            self.method_queue.defer(self._close_listeners)
        super().handle_exit(sig, frame)

    def _close_listeners(self) -> None:
        self.set_accept_enabled(False)
        for listener in self.sockets:
            listener.close()
        self.log.info("draining: listener closed, %s connection(s) in flight", self.nr_conns)


def drain_on_sigint(arbiter: Arbiter) -> None:
    """gunicorn `when_ready` hook: the master treats SIGINT like SIGTERM (graceful stop)."""
    arbiter.handle_int = arbiter.handle_term
