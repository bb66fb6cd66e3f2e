"""Admission control: a request that waited too long for a worker thread is shed, cheaply.

Real gunicorn with ONE worker thread behind its proxy: a slow request occupies it, so the next
one waits in the worker's thread queue — the wait no database deadline can see; the clock is the
proxy's X-Request-Start stamp (dlock.admission).
"""

from __future__ import annotations

import socket
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from devstack.common import wait_until

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


def test_a_client_sent_request_start_is_replaced_by_the_proxy(probe_factory):
    """A client cannot make its own request look old (shed) or young (skip the queue): the
    proxy overwrites X-Request-Start with its own clock."""
    probe = probe_factory(SERVER_QUEUE_DEADLINE_MS="100")
    for stamp in ("t=1.000", f"t={time.time() - 3600:.3f}", "t=9999999999.999"):
        answer = requests.post(
            f"{probe.url}/probe/bump/4",
            json={"tag": "stamped"},
            headers={"X-Request-Start": stamp},
            timeout=10,
        )
        assert answer.status_code == 200, answer.text
    assert probe.sql("SELECT n FROM probe_row WHERE id = 4") == [(3,)]
    assert shed_count(probe) == 0


def test_a_request_whose_proxy_stamp_is_older_than_the_deadline_is_shed(probe_factory):
    """What the proxy's stamp means to the role: sent straight to gunicorn's socket (as the proxy
    does), a stamp older than SERVER_QUEUE_DEADLINE_MS is shed and nothing is done; a fresh one,
    a missing one and a malformed one are served."""
    probe = probe_factory(SERVER_QUEUE_DEADLINE_MS="300")

    def bump(stamp: str | None) -> tuple[int, bytes]:
        body = b'{"tag": "direct"}'
        head = (
            f"POST /probe/bump/5 HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        )
        if stamp is not None:
            head += f"X-Request-Start: {stamp}\r\n"
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(10)
            sock.connect(str(probe.role.socket_path))
            sock.sendall(head.encode() + b"\r\n" + body)
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
        return int(answer.split(b" ", 2)[1]), answer

    status, answer = bump(f"t={time.time() - 1:.3f}")
    assert status == 503 and b'"code":"OVERLOADED"' in answer, answer
    assert probe.sql("SELECT n FROM probe_row WHERE id = 5") == [(0,)]
    for stamp in (f"t={time.time():.3f}", None, "t=soon", "1700000000.000"):
        status, answer = bump(stamp)
        assert status == 200, answer
    assert probe.sql("SELECT n FROM probe_row WHERE id = 5") == [(4,)]
    assert shed_count(probe) == 1


def test_the_queue_wait_is_read_from_the_stamp_alone():
    from dlock.admission import queue_wait

    assert queue_wait("t=100.250", now=101.0) == pytest.approx(0.75)
    assert queue_wait(None) is None and queue_wait("") is None
    assert queue_wait("100.250") is None and queue_wait("t=") is None
    assert queue_wait("t=nan") is None and queue_wait("t=abc") is None
    # the same instant in nginx's seconds.milliseconds, in integer ms and in integer µs
    now = 1_764_662_401.0
    assert queue_wait("t=1764662400.250", now=now) == pytest.approx(0.75)
    assert queue_wait("t=1764662400250", now=now) == pytest.approx(0.75)
    assert queue_wait("t=1764662400250000", now=now) == pytest.approx(0.75)
    assert queue_wait("t=-5") is None and queue_wait("t=inf") is None
