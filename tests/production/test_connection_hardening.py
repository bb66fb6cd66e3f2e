"""No handful of sockets can hold a role hostage, and nothing the client invents grows memory
(issue 15 items 3 and 4): partial heads and drips are closed at SERVER_HEADER_TIMEOUT_MS,
probes are answered outside the request pool, unknown methods never become metric labels,
truncated bodies are never executed, and the target host is always checked."""

from __future__ import annotations

import random
import re
import select
import socket
import string
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from dlock.wire import KNOWN_METHODS
from tests.conftest import raw_request

pytestmark = pytest.mark.live

HEADER_TIMEOUT_MS = 2_000
PROBES = ("/health/live", "/health/ready", "/metrics")


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    from tests.production.conftest import start_probe

    started = start_probe(
        tmp_path_factory.mktemp("connections"), SERVER_HEADER_TIMEOUT_MS=str(HEADER_TIMEOUT_MS)
    )
    yield started
    started.stop()


@pytest.fixture(scope="module")
def patient(tmp_path_factory):
    """A server that holds partial heads for 8 s and lets a request sleep 4 s in the database:
    the tests below prove a probe is answered INSIDE those windows (causally: before any held
    connection is dropped, before any busy thread is freed), not within some wall-clock bound."""
    from tests.production.conftest import start_probe

    started = start_probe(
        tmp_path_factory.mktemp("patient"),
        SERVER_HEADER_TIMEOUT_MS="8000",
        DB_STATEMENT_TIMEOUT_MS="10000",
        GUNICORN_THREADS="16",
    )
    yield started
    started.stop()


def _status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def _closed_after(sock: socket.socket, limit: float) -> tuple[float, bytes]:
    """Seconds until the server closed `sock` (reading what it said), at most `limit`."""
    started = time.monotonic()
    sock.settimeout(limit)
    chunks = []
    try:
        while data := sock.recv(65536):
            chunks.append(data)
    except TimeoutError:
        return float("inf"), b"".join(chunks)
    except ConnectionResetError:  # the proxy resets a connection it timed out
        pass
    return time.monotonic() - started, b"".join(chunks)


def _timed_get(url: str) -> tuple[float, int]:
    started = time.monotonic()
    response = requests.get(url, timeout=10)
    return time.monotonic() - started, response.status_code


def _children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _worker_pid(pod_pid: int) -> int:
    """The gunicorn worker of a pod (devstack.pod: gunicorn master and nginx are its children)."""
    masters = [
        pid
        for pid in _children(pod_pid)
        if b"gunicorn" in Path(f"/proc/{pid}/cmdline").read_bytes()
    ]
    assert len(masters) == 1, masters
    workers = _children(masters[0])
    assert len(workers) == 1, workers
    return workers[0]


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_a_partial_request_line_is_closed_at_the_header_deadline(probe):
    """The proxy closes it at client_header_timeout (nginx sends no 408 for a head)."""
    with socket.create_connection(("127.0.0.1", probe.port)) as sock:
        sock.sendall(b"GET /probe/sleep HTTP/1.1\r\nHost: 12")
        elapsed, answer = _closed_after(sock, 60)
    assert elapsed != float("inf") and answer == b""


def test_a_one_byte_per_half_second_drip_is_closed_by_the_whole_request_deadline(probe):
    head = b"GET /probe/sleep?ms=0 HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 40
    with socket.create_connection(("127.0.0.1", probe.port)) as sock:
        started = time.monotonic()
        try:
            for byte in head:  # each byte well inside any per-recv timeout
                sock.sendall(bytes([byte]))
                time.sleep(0.5)
        except (BrokenPipeError, ConnectionResetError):
            pass
        elapsed, _ = _closed_after(sock, 60)
    # Closed by the whole-head deadline while bytes were still arriving (the drip takes 30 s).
    assert elapsed != float("inf")
    assert time.monotonic() - started < len(head) * 0.5


def test_a_body_that_never_completes_is_closed_and_not_executed(probe):
    before = probe.sql("SELECT n FROM probe_row WHERE id = 2")
    body = b'{"tag":"stalled-body-never"}'
    with socket.create_connection(("127.0.0.1", probe.port)) as sock:
        sock.sendall(
            b"POST /probe/bump/2 HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n" + body
        )
        elapsed, answer = _closed_after(sock, 60)
    assert elapsed != float("inf") and (answer == b"" or _status(answer) == 408)
    assert probe.sql("SELECT n FROM probe_row WHERE id = 2") == before
    assert probe.sql("SELECT count(*) FROM probe_log WHERE tag = 'stalled-body-never'") == [(0,)]


def test_a_truncated_body_with_half_close_is_closed_and_not_executed(probe):
    before = probe.sql("SELECT n FROM probe_row WHERE id = 3")
    body = b'{"tag":"truncated-body-27"}'
    assert len(body) == 27
    with socket.create_connection(("127.0.0.1", probe.port), timeout=10) as sock:
        sock.sendall(
            b"POST /probe/bump/3 HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n" + body
        )
        sock.shutdown(socket.SHUT_WR)
        elapsed, answer = _closed_after(sock, 60)
    # The proxy closes it (nginx: "client prematurely closed connection"), or answers 400.
    assert elapsed != float("inf")
    assert answer == b"" or (_status(answer) == 400 and b'"code":"VALIDATION_FAILED"' in answer)
    assert probe.sql("SELECT n FROM probe_row WHERE id = 3") == before
    assert probe.sql("SELECT count(*) FROM probe_log WHERE tag = 'truncated-body-27'") == [(0,)]


def test_100_partial_connections_leave_probes_fast_and_requests_served(patient):
    partials = []
    try:
        for i in range(100):
            sock = socket.create_connection(("127.0.0.1", patient.port))
            sock.sendall(b"GET /v1/accounts/x HTTP/1.1\r\nHost: 12" if i % 2 else b"G")
            partials.append(sock)
        time.sleep(0.3)  # every one of them accepted and waiting
        for path in PROBES:
            _, status = _timed_get(f"{patient.url}{path}")
            assert status == 200, path
        served = requests.get(f"{patient.url}/probe/sleep", params={"ms": 0}, timeout=5)
        assert served.status_code == 200 and served.json() == {"slept": 0}
        # ... and all of that while the server still held every partial connection open (it
        # drops them only at its 8 s header timeout): nothing waited for them to go away.
        dropped, _, _ = select.select(partials, [], [], 0)
        assert dropped == []
    finally:
        for sock in partials:
            sock.close()


def test_probes_are_answered_while_every_request_thread_is_busy(patient):
    busy = ThreadPoolExecutor(max_workers=24)
    try:
        slow = [
            busy.submit(requests.get, f"{patient.url}/probe/sleep?ms=4000", timeout=30)
            for _ in range(24)
        ]
        time.sleep(0.5)  # the 16 request threads are all taken (8 in pg_sleep, 8 waiting)
        for path in ("/health/live", "/metrics"):
            _, status = _timed_get(f"{patient.url}{path}")
            assert status == 200, path
        # Answered while the threads were still busy: no 4 s sleep had finished yet.
        finished = [f.result().status_code for f in slow if f.done()]
        assert 200 not in finished, finished
        assert all(f.result().status_code in (200, 503, 504) for f in slow)
        assert any(f.result().status_code == 200 for f in slow)  # the sleeps did run
    finally:
        busy.shutdown(wait=True)


def test_http11_without_host_is_400_and_http10_without_host_is_served(probe):
    missing = raw_request(probe.port, b"GET /health/live HTTP/1.1\r\n\r\n")
    assert _status(missing) == 400 and b'"code":"VALIDATION_FAILED"' in missing
    old = raw_request(probe.port, b"GET /health/live HTTP/1.0\r\n\r\n")
    assert _status(old) == 200


def test_an_absolute_form_target_with_a_foreign_host_is_400(probe):
    """The absolute-form target's host is the request's Host (RFC 9112 3.2.2): a foreign one is
    refused on every path but the probes' (/health/*, /metrics answer whatever the Host, as
    kubelet and Prometheus address a pod by its IP)."""
    foreign = raw_request(
        probe.port,
        b"POST http://evil.example/submit HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 2"
        b"\r\nConnection: close\r\n\r\n{}",
    )
    assert _status(foreign) == 400 and b'"code":"VALIDATION_FAILED"' in foreign
    own = raw_request(
        probe.port,
        b"GET http://127.0.0.1:%d/health/live HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close"
        b"\r\n\r\n" % probe.port,
    )
    assert _status(own) == 200


def test_an_unknown_method_is_405_envelope(probe):
    answer = raw_request(probe.port, b"FROBNICATE /health/live HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert _status(answer) == 405
    assert b'"code":"VALIDATION_FAILED"' in answer and b'"retrySafe":false' in answer


def _random_method() -> bytes:
    return "".join(random.choices(string.ascii_uppercase, k=random.randint(4, 12))).encode()


def _send_methods(port: int, count: int) -> None:
    def one(_):
        path = random.choice([b"/health/live", b"/probe/sleep", b"/v1/x"])
        raw_request(
            port,
            _random_method()
            + b" "
            + path
            + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
        )

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(one, range(count)))


def test_10000_random_methods_leave_metrics_size_and_memory_flat(probe):
    metrics = f"{probe.url}/metrics"
    worker = _worker_pid(probe.process.pid)
    _send_methods(probe.port, 200)  # warm-up: every code path that allocates once has run,
    requests.get(metrics, timeout=10)  # the scrape's own series included
    size_before = len(requests.get(metrics, timeout=10).content)
    rss_before = _rss_kib(worker)
    _send_methods(probe.port, 10_000)
    text = requests.get(metrics, timeout=10).text
    rss_after = _rss_kib(worker)
    assert len(text.encode()) - size_before < 2_000, (size_before, len(text))
    assert rss_after - rss_before < 8 * 1024, (rss_before, rss_after)
    labels = set(re.findall(r'method="([^"]*)"', text))
    assert labels <= KNOWN_METHODS | {"<invalid method>"}, labels - KNOWN_METHODS


def test_the_server_keeps_serving_keep_alive_and_pipelined_requests(probe):
    with requests.Session() as session:
        for _ in range(3):
            assert session.get(f"{probe.url}/probe/sleep?ms=0", timeout=5).status_code == 200
    pipelined = raw_request(
        probe.port,
        b"GET /health/live HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
        b"GET /health/live HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
    )
    assert pipelined.count(b"HTTP/1.1 200") == 2


def test_a_pipelined_partial_request_cannot_hold_a_thread(probe):
    """Request 1 complete, request 2 half sent in the same packet: 2 is closed at the deadline
    and, meanwhile, the threads keep serving."""
    stuck = []
    try:
        for _ in range(20):
            sock = socket.create_connection(("127.0.0.1", probe.port))
            sock.sendall(
                b"GET /health/live HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\nGET /probe/sleep HTTP/1.1"
            )
            stuck.append(sock)
        time.sleep(0.3)
        results = []
        threads = [
            threading.Thread(
                target=lambda: results.append(
                    requests.get(f"{probe.url}/probe/sleep?ms=0", timeout=5).status_code
                )
            )
            for _ in range(4)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert results == [200] * 4
        elapsed, answer = _closed_after(stuck[0], 20)
        # The complete one answered; the partial one closed at the proxy's header timeout.
        assert answer.startswith(b"HTTP/1.1 200") and answer.count(b"HTTP/1.1 ") == 1
    finally:
        for sock in stuck:
            sock.close()


def test_expect_100_continue_is_answered_before_the_body_arrives(probe):
    body = b'{"tag":"expect-continue"}'
    with socket.create_connection(("127.0.0.1", probe.port), timeout=5) as sock:
        sock.sendall(
            b"POST /probe/bump/1 HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
            b"\r\nExpect: 100-continue\r\nConnection: close\r\nContent-Length: %d\r\n\r\n"
            % len(body)
        )
        sock.settimeout(1.0)
        assert sock.recv(4096).startswith(b"HTTP/1.1 100 Continue")
        sock.sendall(body)
        elapsed, answer = _closed_after(sock, 10)
    assert b"HTTP/1.1 200" in answer
    assert probe.sql("SELECT count(*) FROM probe_log WHERE tag = 'expect-continue'") == [(1,)]
