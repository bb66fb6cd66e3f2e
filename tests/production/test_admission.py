"""Admission control: a request that waited too long for a worker thread is shed, cheaply.

Real gunicorn with ONE worker thread: a slow request occupies it, so the next one waits in the
worker's thread queue — the wait no database deadline can see (dlock.serving, dlock.admission).
"""

from __future__ import annotations

import select
import socket
import struct
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from devstack import wait_until
from dlock.serving import SO_TIMESTAMP, arrived_seconds_ago, kernel_stamp

pytestmark = [pytest.mark.live, pytest.mark.slow]

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


def shed_count(probe) -> float:
    text = requests.get(f"{probe.url}/metrics", timeout=10).text
    line = next(ln for ln in text.splitlines() if ln.startswith("dlock_requests_shed_total "))
    return float(line.split()[1])


def active_sleeps(probe) -> int:
    return probe.sql(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND query LIKE 'SELECT pg_sleep%%' AND state = 'active'"
    )[0][0]


def test_a_request_queued_past_the_deadline_is_503_overloaded_and_changes_nothing(probe_factory):
    probe = probe_factory(
        GUNICORN_THREADS="1",
        SERVER_QUEUE_DEADLINE_MS="200",
        DB_STATEMENT_TIMEOUT_MS="10000",
    )
    before = shed_count(probe)
    tag = f"shed-{uuid.uuid4()}"
    with ThreadPoolExecutor(2) as pool:
        slow = pool.submit(
            requests.get, f"{probe.url}/probe/sleep", params={"ms": 1500}, timeout=30
        )
        wait_until(lambda: active_sleeps(probe) == 1, timeout=20, what="the only thread busy")
        started = time.monotonic()
        shed = requests.post(
            f"{probe.url}/probe/bump/1",
            json={"tag": tag},
            headers={"traceparent": f"00-{TRACE}-00f067aa0ba902b7-01"},
            timeout=30,
        )
        waited = time.monotonic() - started
        assert slow.result().status_code == 200  # the request already running is unharmed

    assert shed.status_code == 503, shed.text
    assert shed.headers["Content-Type"] == "application/json; charset=utf-8"
    assert int(shed.headers["Content-Length"]) == len(shed.content)
    assert int(shed.headers["Retry-After"]) >= 1
    assert shed.headers["X-Content-Type-Options"] == "nosniff"
    assert shed.headers["Cache-Control"] == "no-store"
    body = shed.json()
    assert set(body) == {"code", "message", "retrySafe", "retryAfterMillis", "traceId"}
    assert body["code"] == "OVERLOADED" and body["retrySafe"] is True
    assert body["retryAfterMillis"] > 0 and body["traceId"] == TRACE
    # It was answered when the thread came free (~1.5 s), not after doing its work, and the
    # work was never done: no log row, row 1 untouched.
    assert waited < 10
    assert probe.sql("SELECT count(*) FROM probe_log WHERE tag = %s", (tag,)) == [(0,)]
    assert probe.sql("SELECT n FROM probe_row WHERE id = 1") == [(0,)]
    assert shed_count(probe) == before + 1
    assert '"event":"requests_shed"' in probe.log()  # python-json-logger's orjson line


def test_probes_are_never_shed_and_an_idle_server_sheds_nothing(probe_factory):
    probe = probe_factory(GUNICORN_THREADS="1", SERVER_QUEUE_DEADLINE_MS="100")
    with ThreadPoolExecutor(2) as pool:
        slow = pool.submit(requests.get, f"{probe.url}/probe/sleep", params={"ms": 800}, timeout=30)
        wait_until(lambda: active_sleeps(probe) == 1, timeout=20, what="the only thread busy")
        live = requests.get(f"{probe.url}/health/live", timeout=30)
        assert slow.result().status_code == 200
    assert live.status_code == 200  # waited behind the sleep, but a probe is served
    # Unqueued requests pass straight through.
    for row in (2, 3):
        answer = requests.post(f"{probe.url}/probe/bump/{row}", json={"tag": "idle"}, timeout=10)
        assert answer.status_code == 200, answer.text
    assert shed_count(probe) == 0


def stamped_pair(listener: socket.socket) -> tuple[socket.socket, socket.socket]:
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    server.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMP, 1)
    return client, server


def kernel_stamps_tcp(listener: socket.socket) -> bool:
    """Whether this kernel stamps TCP reads (SO_TIMESTAMP) that the reader peeks at.

    Linux turns receive stamping on for the whole machine only once some socket asks for it, and
    it does so a moment later, from a work queue: bytes that arrive first are not stamped. The
    caller keeps one stamped socket open (so stamping stays on) and this polls for up to 5 s until
    a fresh connection's bytes carry a stamp; some sandboxed network stacks never stamp at all."""
    deadline = time.monotonic() + 5
    while True:
        client, server = stamped_pair(listener)
        with client, server:
            client.sendall(b"x")
            select.select([server], [], [], 5)
            if arrived_seconds_ago(server) is not None:
                return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def test_the_arrival_clock_reads_the_kernels_receive_timestamp_without_consuming():
    """What the admission deadline measures: time since the request's bytes arrived, including
    the wait for the worker's main loop, which the thread-pool stamp alone would not see. On a
    kernel that does not stamp TCP reads the reader says so (None) and the worker falls back to
    the time its main loop read the bytes (the shedding tests above run on that clock there)."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        holder_client, holder = stamped_pair(listener)  # keeps the kernel's stamping on
        with holder_client, holder:
            stamps = kernel_stamps_tcp(listener)
            client, server = stamped_pair(listener)
            with client, server:
                assert arrived_seconds_ago(server) is None  # nothing buffered yet
                client.sendall(b"GET / HTTP/1.1\r\n\r\n")
                time.sleep(0.3)
                ago = arrived_seconds_ago(server)
                if stamps:
                    assert ago is not None and 0.3 <= ago < 60
                else:
                    assert ago is None
                assert server.recv(100) == b"GET / HTTP/1.1\r\n\r\n"  # the peek consumed nothing


def test_a_receive_stamp_is_read_from_the_control_message_and_a_stepped_clock_is_refused():
    """The parser behind both readers, on control messages built by hand (no kernel needed)."""
    now = time.time()

    def timeval(at: float) -> bytes:
        return struct.pack("ll", int(at), int((at % 1) * 1e6))

    stamped = [(socket.SOL_SOCKET, SO_TIMESTAMP, timeval(now - 2.5))]
    assert kernel_stamp(stamped) == pytest.approx(now - 2.5, abs=1e-5)
    assert kernel_stamp([]) is None
    assert kernel_stamp([(socket.IPPROTO_IP, SO_TIMESTAMP, timeval(now))]) is None  # other level
    assert kernel_stamp([(socket.SOL_SOCKET, SO_TIMESTAMP, b"\x00" * 4)]) is None  # truncated
    assert kernel_stamp([(socket.SOL_SOCKET, SO_TIMESTAMP, timeval(now + 30))]) is None  # future
    assert kernel_stamp([(socket.SOL_SOCKET, SO_TIMESTAMP, timeval(now - 7200))]) is None  # stepped
