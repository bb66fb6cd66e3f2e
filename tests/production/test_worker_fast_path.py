"""The worker's per-request shortcuts keep gunicorn's behaviour (issue 18, dlock.serving): a
kept-alive connection handed back to the poller by its serving thread still honours the
keep-alive timeout, max requests and the header deadline of its next request; pipelined
requests are answered in order across both pools; the throttled heartbeat still lets the
arbiter kill a worker whose loop is stuck, and never kills an idle one."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import time
from pathlib import Path

import pytest
import requests

from dlock.serving import (
    HEARTBEAT_INTERVAL_S,
    ConfigSnapshot,
    _Incomplete,
    _Refused,
    _request_complete,
)
from tests.production.test_connection_hardening import _closed_after, _status, _worker_pid

pytestmark = pytest.mark.live

KEEPALIVE_S = 1
HEADER_TIMEOUT_MS = 1_500
GET_SLEEP = b"GET /probe/sleep?ms=%d HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
GET_LIVE = b"GET /health/live HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    from tests.production.conftest import start_probe

    started = start_probe(
        tmp_path_factory.mktemp("fastpath"),
        GUNICORN_KEEPALIVE=str(KEEPALIVE_S),
        SERVER_HEADER_TIMEOUT_MS=str(HEADER_TIMEOUT_MS),
    )
    yield started
    started.stop()


def _responses(sock: socket.socket, count: int, timeout: float = 10) -> list[tuple[bytes, bytes]]:
    """Read `count` Content-Length framed responses: (head, body) each."""
    sock.settimeout(timeout)
    buf = b""
    out = []
    while len(out) < count:
        end = buf.find(b"\r\n\r\n")
        if end >= 0:
            head = buf[:end]
            match = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)
            length = int(match.group(1)) if match else 0
            if len(buf) >= end + 4 + length:
                out.append((head, buf[end + 4 : end + 4 + length]))
                buf = buf[end + 4 + length :]
                continue
        chunk = sock.recv(65536)
        assert chunk, f"closed after {len(out)} responses"
        buf += chunk
    return out


def test_a_kept_alive_connection_is_reused_then_closed_at_the_keepalive_timeout(probe):
    with socket.create_connection(("127.0.0.1", probe.port)) as sock:
        for ms in (0, 5, 0):  # served, handed back to the poller, served again on the same socket
            sock.sendall(GET_SLEEP % ms)
            [(head, body)] = _responses(sock, 1)
            assert _status(head) == 200 and b"connection: keep-alive" in head.lower()
            assert json.loads(body) == {"slept": ms}
        elapsed, said = _closed_after(sock, 10 * KEEPALIVE_S)
    assert said == b""  # closed quietly, nothing more written
    assert KEEPALIVE_S * 0.5 <= elapsed <= KEEPALIVE_S + 3


def test_the_next_request_on_a_kept_alive_connection_has_the_header_deadline(probe):
    with socket.create_connection(("127.0.0.1", probe.port)) as sock:
        sock.sendall(GET_SLEEP % 0)
        [(head, _)] = _responses(sock, 1)
        assert _status(head) == 200
        sock.sendall(b"GET /probe/sleep?ms=0 HTTP/1.1\r\nHost: 12")  # and never the rest
        elapsed, said = _closed_after(sock, 20)
    assert _status(said) == 408
    assert HEADER_TIMEOUT_MS / 1000 * 0.8 <= elapsed <= HEADER_TIMEOUT_MS / 1000 + 3


def test_a_client_closing_a_kept_alive_connection_frees_it(probe):
    before = _open_connections(probe)
    socks = [socket.create_connection(("127.0.0.1", probe.port)) for _ in range(20)]
    for sock in socks:
        sock.sendall(GET_LIVE)
        _responses(sock, 1)
    for sock in socks:
        sock.close()
    deadline = time.monotonic() + 10
    while _open_connections(probe) > before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _open_connections(probe) <= before


def _open_connections(probe) -> int:
    """Established TCP connections the worker holds on its port (from /proc/net/tcp)."""
    port = f"{probe.port:04X}"
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        cols = line.split()
        if cols[1].endswith(f":{port}") and cols[3] == "01":  # local port, ESTABLISHED
            count += 1
    return count


def test_pipelined_requests_are_answered_in_order_across_both_pools(probe):
    # Slow and fast requests on the request pool, probes on the monitoring pool, all in one send.
    plan = [40, None, 0, 25, None, 0, 10, None]
    wire = b"".join(GET_LIVE if ms is None else GET_SLEEP % ms for ms in plan)
    with socket.create_connection(("127.0.0.1", probe.port)) as sock:
        sock.sendall(wire)
        answers = _responses(sock, len(plan))
        sock.sendall(GET_SLEEP % 1)  # and the connection is still alive after them
        [(last_head, last_body)] = _responses(sock, 1)
    for ms, (head, body) in zip(plan, answers, strict=True):
        assert _status(head) == 200
        if ms is None:
            assert json.loads(body)["status"] == "UP"
        else:
            assert json.loads(body) == {"slept": ms}
    assert _status(last_head) == 200 and json.loads(last_body) == {"slept": 1}


def test_max_requests_closes_the_kept_alive_connection_and_a_new_worker_serves(probe_factory):
    served = probe_factory(GUNICORN_CMD_ARGS="--max-requests 6")
    first_worker = _worker_pid(served.process.pid)
    with socket.create_connection(("127.0.0.1", served.port)) as sock:
        heads = []
        for ms in range(6):  # the readiness probe already used up some of the six
            sock.sendall(GET_SLEEP % ms)
            [(head, _)] = _responses(sock, 1)
            heads.append(head.lower())
            if b"connection: close" in heads[-1]:
                break
        elapsed, said = _closed_after(sock, 10)
    assert b"connection: close" in heads[-1], heads
    assert all(b"connection: keep-alive" in head for head in heads[:-1])
    assert said == b"" and elapsed < 5
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if requests.get(f"{served.url}/probe/sleep?ms=0", timeout=5).status_code == 200:
                break
        except requests.ConnectionError:
            pass
        time.sleep(0.2)
    assert _worker_pid(served.process.pid) != first_worker


def _heartbeat_mtime(worker_pid: int) -> float:
    """mtime of the worker's heartbeat file (unlinked at once, so read through its fd)."""
    for fd in Path(f"/proc/{worker_pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if "wgunicorn-" in target:
            return os.stat(fd).st_mtime
    raise AssertionError("no heartbeat file open in the worker")


def test_the_heartbeat_is_touched_at_most_every_interval_under_load_and_when_idle(probe):
    worker = _worker_pid(probe.process.pid)
    seen = {_heartbeat_mtime(worker)}
    with socket.create_connection(("127.0.0.1", probe.port)) as sock:
        started = time.monotonic()
        while time.monotonic() - started < 2.0:  # hundreds of loop turns
            sock.sendall(GET_LIVE)
            _responses(sock, 1)
            seen.add(_heartbeat_mtime(worker))
    assert 2 <= len(seen) <= 2.0 / HEARTBEAT_INTERVAL_S + 2
    idle_start = _heartbeat_mtime(worker)
    time.sleep(2.5)  # idle: the loop still turns once a second, and beats
    assert _heartbeat_mtime(worker) > idle_start


def test_a_stuck_worker_is_still_killed_by_the_arbiter_and_an_idle_one_is_not(probe_factory):
    served = probe_factory(GUNICORN_TIMEOUT="3")
    worker = _worker_pid(served.process.pid)
    time.sleep(7)  # more than twice the timeout, idle: the heartbeat keeps it alive
    assert _worker_pid(served.process.pid) == worker
    os.kill(worker, signal.SIGSTOP)  # its loop stops: no heartbeat any more
    try:
        deadline = time.monotonic() + 30
        replaced = None
        while time.monotonic() < deadline:
            children = Path(f"/proc/{served.process.pid}/task/{served.process.pid}/children")
            pids = [int(p) for p in children.read_text().split()]
            if pids and worker not in pids:
                replaced = pids[0]
                break
            time.sleep(0.2)
        assert replaced is not None, "the arbiter never killed the stopped worker"
    finally:
        if Path(f"/proc/{worker}").exists():
            os.kill(worker, signal.SIGCONT)
    assert "WORKER TIMEOUT" in served.log()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if requests.get(f"{served.url}/health/live", timeout=5).status_code == 200:
                break
        except requests.ConnectionError:
            pass
        time.sleep(0.2)
    assert requests.get(f"{served.url}/probe/sleep?ms=0", timeout=5).status_code == 200


def test_the_config_snapshot_reads_each_setting_once_and_refuses_unknown_names():
    from gunicorn.config import Config

    live = Config()
    live.set("keepalive", 7)
    snapshot = ConfigSnapshot(live)
    assert snapshot.keepalive == 7 and not snapshot.is_ssl
    assert "keepalive" in vars(snapshot)  # a plain attribute from now on
    with pytest.raises(AttributeError):
        _ = snapshot.no_such_setting


@pytest.mark.parametrize(
    ("head", "expected"),
    [
        (b"GET /a?b=1 HTTP/1.1\r\nHost: h\r\n\r\n", "/a"),
        (b"GET / HTTP/1.1\r\n\r\n", "/"),
        (b"POST /p HTTP/1.1\r\nX-Note: content-length\r\n\r\n", "/p"),
        (b"POST /p HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc", "/p"),
        (b"POST /p HTTP/1.1\r\ncontent-length:  2 \r\n\r\nab", "/p"),
        (b"POST /p HTTP/1.1\r\nContent-Length: x\r\n\r\n", ""),
        (b"NOT A REQUEST\r\n\r\n", ""),
    ],
)
def test_the_arrival_framing_finds_complete_requests(head, expected):
    assert _request_complete(head, max_head=8192, max_body=64) == expected


def test_the_arrival_framing_waits_for_bodies_and_refuses_what_it_must():
    with pytest.raises(_Incomplete) as waiting:
        _request_complete(
            b"POST /p HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 9\r\n\r\nab",
            max_head=8192,
            max_body=64,
        )
    assert waiting.value.args == (True,)
    for head, status in (
        (b"POST /p HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", 411),
        (b"POST /p HTTP/1.1\r\nContent-Length: 65\r\n\r\n", 413),
        (b"BREW /p HTTP/1.1\r\n\r\n", 501),
        (b"GET /" + b"a" * 9000, 431),
    ):
        with pytest.raises(_Refused) as refused:
            _request_complete(head, max_head=8192, max_body=64)
        assert refused.value.args[0] == status


class _RecordingSocket:
    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def sendall(self, data: bytes) -> None:
        self.writes.append(bytes(data))


def _written(response_class, method: bytes, status: str, headers, chunks) -> list[bytes]:
    from gunicorn.config import Config
    from gunicorn.http import RequestParser

    cfg = Config()
    parser = RequestParser(cfg, iter([method + b" / HTTP/1.1\r\nHost: h\r\n\r\n"]), ("::1", 1))
    sock = _RecordingSocket()
    response = response_class(next(parser), sock, cfg)
    response.start_response(status, list(headers))
    for chunk in chunks:
        response.write(chunk)
    response.close()
    return sock.writes


@pytest.mark.parametrize(
    ("method", "status", "headers", "chunks"),
    [
        (b"GET", "200 OK", [("Content-Length", "5")], [b"hello"]),
        (b"GET", "200 OK", [("Content-Length", "6")], [b"abc", b"def"]),
        (b"GET", "200 OK", [("Content-Length", "0")], []),
        (b"GET", "200 OK", [("Content-Length", "2")], [b"", b"ok"]),
        (b"GET", "200 OK", [], [b"streamed", b" in chunks"]),  # chunked framing
        (b"GET", "200 OK", [], []),
        (b"HEAD", "200 OK", [("Content-Length", "5")], [b"hello"]),
        (b"GET", "204 No Content", [], [b""]),
    ],
)
def test_one_write_response_puts_the_same_bytes_on_the_wire_as_gunicorn(
    method, status, headers, chunks
):
    from gunicorn.http.wsgi import Response

    from dlock.serving import OneWriteResponse

    stock = _written(Response, method, status, headers, chunks)
    ours = _written(OneWriteResponse, method, status, headers, chunks)

    def without_date(data: bytes) -> bytes:
        return re.sub(rb"Date: [^\r]*\r\n", b"", data)

    assert without_date(b"".join(ours)) == without_date(b"".join(stock))
    if method == b"GET" and headers and chunks and chunks[0]:
        assert len(ours) == len(stock) - 1  # the head went out with the first body bytes


def test_a_head_request_gets_the_head_alone_and_the_connection_stays_usable(probe):
    with socket.create_connection(("127.0.0.1", probe.port)) as sock:
        sock.sendall(b"HEAD /health/live HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        sock.settimeout(10)
        head = b""
        while b"\r\n\r\n" not in head:
            head += sock.recv(65536)
        assert _status(head) in (200, 405) and head.endswith(b"\r\n\r\n")
        sock.sendall(GET_SLEEP % 2)
        [(again, body)] = _responses(sock, 1)
    assert _status(again) == 200 and json.loads(body) == {"slept": 2}


def test_the_cached_date_header_is_the_text_gunicorn_formats():
    import email.utils

    from dlock.serving import http_date

    for stamp in (0, 1.9, 59.999, 1_796_151_745.2, time.time()):
        expected = email.utils.formatdate(stamp, localtime=False, usegmt=True)
        assert http_date(stamp) == expected
        assert http_date(stamp) == expected  # cached
    before = email.utils.formatdate(time.time(), localtime=False, usegmt=True)
    now = http_date()
    after = email.utils.formatdate(time.time(), localtime=False, usegmt=True)
    assert now in (before, after)


def test_clients_that_never_close_after_connection_close_do_not_stall_the_worker(probe):
    # gunicorn lingers on a closing connection (close_graceful: FIN, then read until the peer
    # closes, up to 2 s) inside the main loop: five clients that asked for Connection: close and
    # then never closed held every accept, arrival and probe for about 10 s, one after another.
    held = []
    for _ in range(5):
        sock = socket.create_connection(("127.0.0.1", probe.port))
        sock.sendall(
            b"GET /probe/sleep?ms=0 HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
        )
        held.append(sock)
    for sock in held:  # each gets its whole answer, then the worker's FIN
        ((head, body),) = _responses(sock, 1)
        assert head.startswith(b"HTTP/1.1 200") and json.loads(body) == {"slept": 0}
        sock.settimeout(5)
        assert sock.recv(100) == b""
    worker = _worker_pid(probe.process.pid)
    live = socket.create_connection(("127.0.0.1", probe.port))
    live.sendall(GET_LIVE)
    ((head, _),) = _responses(live, 1)
    # Causal, not a wall-clock bound: the probe was answered while the worker still held all
    # five lingering connections (each for up to 2 s); before the fix the loop answered it only
    # after lingering on each of them in turn, by when it had closed them all.
    still_held = _client_fds(worker, probe.port) - 1  # the probe's own connection
    assert head.startswith(b"HTTP/1.1 200")
    assert still_held == 5, still_held
    live.close()
    # The lingering ends (the worker closes them) within its 2 s, plus a loop turn.
    deadline = time.monotonic() + 6
    while _client_fds(worker, probe.port) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _client_fds(worker, probe.port) == 0
    for sock in held:
        sock.close()


def _client_fds(pid: int, port: int) -> int:
    """Sockets the worker process holds open on its own port (its clients, not the listener)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        cols = line.split()
        if cols[1].endswith(f":{port:04X}") and cols[3] != "0A" and cols[9] in inodes:
            count += 1
    return count
