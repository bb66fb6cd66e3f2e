"""Hostile connections against the real topology: payment-resource's gunicorn behind its nginx
(issue 25 items 1 and 7).

Each test holds its hostile sockets open and, WHILE they are held (checked after the fact: not
one of them was closed or answered yet), makes an authenticated data call and a liveness probe
that must be answered correctly. Then the hostile ones must end in a 4xx or be closed by the
proxy's timeouts, the payout and its account must be unchanged, and the role must not have
logged an ERROR line for a client's mistake. No wall-clock bounds: waits are for events.
"""

from __future__ import annotations

import json
import os
import re
import select
import socket
import subprocess
import sys
import threading
import time

import psycopg
import pytest
import requests

from devstack.common import free_port
from devstack.roles import RoleProcess
from tests import credentials
from tests.production.conftest import migrated_paydb, seed_payouts

pytestmark = [pytest.mark.live, pytest.mark.slow]

HEADER_TIMEOUT_MS = 2_000


class Target:
    def __init__(self, proc: RoleProcess, db_url: str, account_id: str, payout_id: str) -> None:
        self.proc = proc
        self.db_url = db_url
        self.account_id = account_id
        self.payout_id = payout_id

    @property
    def port(self) -> int:
        return self.proc.port

    def sql(self, statement: str, params: tuple = ()) -> list[tuple]:
        with psycopg.connect(self.db_url, autocommit=True) as conn:
            cur = conn.execute(statement, params)
            return cur.fetchall() if cur.description else []

    def books(self) -> tuple:
        """Everything a claim would change: the payout, its events, the account."""
        return (
            self.sql(
                "SELECT state, attempt_count, claim_token FROM payout WHERE payout_id = %s",
                (self.payout_id,),
            ),
            self.sql("SELECT count(*) FROM payout_event WHERE payout_id = %s", (self.payout_id,)),
            self.sql(
                "SELECT balance_minor, fence FROM account WHERE account_id = %s",
                (self.account_id,),
            ),
        )

    def log_size(self) -> int:
        return self.proc.logfile.stat().st_size

    def errors_since(self, offset: int) -> list[str]:
        with open(self.proc.logfile, "rb") as log:
            log.seek(offset)
            text = log.read().decode(errors="replace")
        return [line for line in text.splitlines() if '"ERROR"' in line or "Traceback" in line]

    def served(self) -> None:
        """An authenticated data call and the liveness probe, answered correctly."""
        payout = requests.get(f"{self.proc.url}/v1/payouts/{self.payout_id}", timeout=30)
        assert payout.status_code == 200, payout.text
        assert payout.json()["payoutId"] == self.payout_id
        assert payout.json()["state"] == "PENDING"
        account = requests.get(f"{self.proc.url}/v1/accounts/{self.account_id}", timeout=30)
        assert account.status_code == 200 and account.json()["accountId"] == self.account_id
        live = requests.get(f"{self.proc.url}/health/live", timeout=30)
        assert live.status_code == 200, live.text


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    db_url, env = migrated_paydb("hostile", SERVER_HEADER_TIMEOUT_MS=str(HEADER_TIMEOUT_MS))
    ids = seed_payouts(env, payouts=1)
    logdir = tmp_path_factory.mktemp("hostile")
    proc = RoleProcess("payments", free_port(), env, logdir / "payments.log").start()
    yield Target(proc, db_url, ids["accounts"][0], ids["payouts"][0])
    proc.stop()


def open_socket(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.setblocking(True)
    return sock


def still_held(socks: list[socket.socket]) -> bool:
    """Not one of them was answered or closed by the server yet."""
    readable, _, _ = select.select(socks, [], [], 0)
    return readable == []


def ending(sock: socket.socket, limit: float = 120) -> bytes:
    """Everything the server still says on `sock` until it closes it (b"": closed silently)."""
    sock.settimeout(limit)
    chunks = []
    try:
        while data := sock.recv(65536):
            chunks.append(data)
    except ConnectionResetError:
        pass
    return b"".join(chunks)


def statuses(answer: bytes) -> list[int]:
    return [int(code) for code in re.findall(rb"HTTP/1\.[01] (\d{3})", answer)]


def ended_by_proxy(answer: bytes) -> bool:
    """Closed without an answer (the proxy's timeout), or every answer a 4xx envelope."""
    if answer == b"":
        return True
    codes = statuses(answer)
    return bool(codes) and all(400 <= code < 500 for code in codes) and b'"code":' in answer


def claim_head(target: Target, *, prefix: bytes = b"", length: int = 100) -> bytes:
    return (
        prefix + b"POST /v1/payouts/%s/claim HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nX-Fencing-Token: 999\r\nX-Owner-Id: attacker\r\n"
        b"X-Idempotency-Key: payout-%s\r\nContent-Length: %d\r\n\r\n"
        % (target.payout_id.encode(), target.payout_id.encode(), length)
    )


# ------------------------------------------------------------------------ the vectors


def test_a_leading_empty_line_and_a_body_never_sent_hold_nothing(target):
    """The blocker of issue 25: `\\r\\nPOST …claim … Content-Length: 100`, body never sent,
    no credential. The proxy waits for the body itself; no gunicorn thread ever sees it."""
    books, log = target.books(), target.log_size()
    hostile = []
    try:
        for _ in range(40):
            sock = open_socket(target.port)
            sock.sendall(claim_head(target, prefix=b"\r\n"))
            hostile.append(sock)
        for _ in range(3):
            target.served()
        assert still_held(hostile)
        answers = [ending(sock) for sock in hostile]
    finally:
        for sock in hostile:
            sock.close()
    assert all(ended_by_proxy(answer) for answer in answers), answers[:3]
    assert target.books() == books
    assert target.errors_since(log) == []


def test_m_search_with_a_content_length_is_405_and_its_body_is_never_a_request(target):
    """A method no route has, with a body still to come: refused 405 (envelope) by the proxy,
    and the bytes of that body are discarded, never read as a second request."""
    books, log = target.books(), target.log_size()
    smuggled = claim_head(target, length=2) + b"{}"
    head = b"M-SEARCH /v1/payouts HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %d\r\n\r\n"
    with open_socket(target.port) as sock:
        sock.sendall(head % len(smuggled) + smuggled)
        answer = ending(sock)
    assert statuses(answer) == [405], answer
    assert b'"code":"VALIDATION_FAILED"' in answer and b'"retrySafe":false' in answer
    held = []
    try:
        for _ in range(20):  # the same with the body never sent: answered, nothing held
            sock = open_socket(target.port)
            sock.sendall(head % 100)
            held.append(sock)
        target.served()
        answers = [ending(sock) for sock in held]
    finally:
        for sock in held:
            sock.close()
    assert all(statuses(answer)[:1] == [405] for answer in answers), answers[:3]
    assert target.books() == books
    assert target.errors_since(log) == []


@pytest.mark.parametrize("method", [b"TRACE", b"M-SEARCH", b"FROBNICATE", b"PROPFIND"])
def test_methods_no_route_has_are_405_envelopes(target, method):
    with open_socket(target.port) as sock:
        sock.sendall(
            method + b" /v1/payouts HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
        )
        answer = ending(sock)
    assert statuses(answer) == [405], answer
    head, _, body = answer.partition(b"\r\n\r\n")
    assert b"application/json" in head
    envelope = json.loads(body)
    assert set(envelope) == {"code", "message", "retrySafe", "details", "traceId"}
    assert envelope["code"] == "VALIDATION_FAILED" and len(envelope["traceId"]) == 32


def test_150_partial_heads_are_held_by_the_proxy_alone(target):
    books, log = target.books(), target.log_size()
    partial = []
    try:
        for i in range(150):
            sock = open_socket(target.port)
            sock.sendall(b"GET /v1/payouts HTTP/1.1\r\nHost: 12" if i % 2 else b"P")
            partial.append(sock)
        for _ in range(3):
            target.served()
        assert still_held(partial)
        answers = [ending(sock) for sock in partial]
    finally:
        for sock in partial:
            sock.close()
    assert all(ended_by_proxy(answer) for answer in answers), answers[:3]
    assert target.books() == books
    assert target.errors_since(log) == []


def test_60_drip_connections_head_and_body_are_held_by_the_proxy_alone(target):
    """30 connections drip a head and 30 a claim body, a byte each per 0.3 s round; while they
    drip, data calls are served. When they stop, the proxy's timeouts close them."""
    books, log = target.books(), target.log_size()
    heads = [b"GET /v1/payouts?state=PENDING HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 80]
    bodies = [b'{"expectedState": "PENDING", "pad": "' + b"x" * 80]
    drips: list[tuple[socket.socket, bytes]] = []
    stop = threading.Event()
    sent_rounds = []

    def drip() -> None:
        position = 0
        while not stop.is_set():
            for sock, data in drips:
                if position < len(data):
                    try:
                        sock.sendall(data[position : position + 1])
                    except OSError:
                        pass
            position += 1
            sent_rounds.append(position)
            stop.wait(0.3)

    try:
        for i in range(60):
            sock = open_socket(target.port)
            if i % 2:
                sock.sendall(claim_head(target, length=200))
                drips.append((sock, bodies[0]))
            else:
                drips.append((sock, heads[0]))
        dripper = threading.Thread(target=drip, daemon=True)
        dripper.start()
        while len(sent_rounds) < 3:
            time.sleep(0.05)
        for _ in range(3):
            target.served()
        socks = [sock for sock, _ in drips]
        still_dripping = len(sent_rounds)
        body_socks = socks[1::2]
        assert still_held(body_socks)  # a body that keeps arriving is waited for
        stop.set()
        dripper.join()
        answers = [ending(sock) for sock in socks]
    finally:
        stop.set()
        for sock, _ in drips:
            sock.close()
    assert still_dripping >= 3
    assert all(ended_by_proxy(answer) for answer in answers), answers[:3]
    assert target.books() == books
    assert target.errors_since(log) == []


def test_600_idle_keep_alive_sockets_hold_nothing(target):
    log = target.log_size()
    idle = []
    try:
        # from three addresses: one holds at most PROXY_TCP_PER_CLIENT connections (512)
        for n in range(600):
            sock = socket.create_connection(
                ("127.0.0.1", target.port), timeout=30, source_address=(f"127.0.0.{2 + n % 3}", 0)
            )
            idle.append(sock)
        # each answered once and kept alive (one at a time: 600 at once from one address would
        # be over its cap of requests in progress, PROXY_CONN_PER_CLIENT)
        for sock in idle:
            sock.sendall(b"GET /health/live HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            answer = b""
            while b"\r\n\r\n" not in answer:
                data = sock.recv(65536)
                assert data, answer  # closed without an answer
                answer += data
            head, _, body = answer.partition(b"\r\n\r\n")
            length = int(
                next(
                    line.split(b":", 1)[1]
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
            )
            while len(body) < length:
                body += sock.recv(65536)
            assert statuses(head) == [200]
        for _ in range(3):
            target.served()
        assert still_held(idle)
        answers = [ending(sock) for sock in idle]  # closed at the proxy's keep-alive timeout
    finally:
        for sock in idle:
            sock.close()
    assert set(answers) == {b""}
    assert target.errors_since(log) == []


SMUGGLING = {
    "CL.TE": b"Content-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nX",
    "TE.CL": b"Transfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n1\r\nX\r\n0\r\n\r\n",
    "duplicate CL": b"Content-Length: 2\r\nContent-Length: 40\r\n\r\n{}",
    "duplicate equal CL": b"Content-Length: 2\r\nContent-Length: 2\r\n\r\n{}",
    "CL list": b"Content-Length: 2, 2\r\n\r\n{}",
    "signed CL": b"Content-Length: +2\r\n\r\n{}",
    "TE obfuscated": b"Transfer-Encoding: xchunked\r\n\r\n{}",
    "TE with space": b"Transfer-Encoding : chunked\r\n\r\n0\r\n\r\n",
    "TE list": b"Transfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n",
    "chunked": b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
    "obs-fold": b"Content-Length: 2\r\nX-Fold: a\r\n b\r\n\r\n{}",
    "NUL in header": b"Content-Length: 2\r\nX-Nul: a\x00b\r\n\r\n{}",
    "bare CR": b"Content-Length: 2\r\nX-Cr: a\rb\r\n\r\n{}",
}


@pytest.mark.parametrize("headers", list(SMUGGLING.values()), ids=list(SMUGGLING))
def test_smuggling_vectors_are_refused_or_framed_by_the_proxy_alone(target, headers):
    """Each vector carries a second, complete claim behind its body: whatever the proxy makes of
    the framing, every answer is a 4xx envelope, the claim is never executed, and the
    next connection is served."""
    books, log = target.books(), target.log_size()
    inner = claim_head(target, length=2) + b"{}"
    outer = (
        b"POST /v1/payouts/%s/claim HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
        b"\r\n" % target.payout_id.encode()
    )
    with open_socket(target.port) as sock:
        sock.sendall(outer + headers + inner)
        answer = ending(sock)
    assert ended_by_proxy(answer), answer
    assert 200 not in statuses(answer) and b"<html" not in answer.lower()
    target.served()
    assert target.books() == books
    assert target.errors_since(log) == []


def test_pipelined_requests_are_answered_in_order_and_a_partial_second_one_is_closed(target):
    first = b"GET /v1/payouts/%s HTTP/1.1\r\nHost: 127.0.0.1\r\n" % target.payout_id.encode()
    first = credentials.with_authorization(first + b"\r\n")
    second = credentials.with_authorization(
        b"GET /v1/accounts/%s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
        % target.account_id.encode()
    )
    with open_socket(target.port) as sock:
        sock.sendall(first + second)
        answer = ending(sock)
    assert statuses(answer) == [200, 200], answer
    assert answer.index(target.payout_id.encode()) < answer.index(b'"accountId"')
    with open_socket(target.port) as sock:
        sock.sendall(first + b"GET /v1/payouts HTTP/1.1\r\nHost: 12")
        target.served()
        answer = ending(sock)  # the first answered, the second closed at the header timeout
    assert statuses(answer) == [200], answer


# ---------------------------------------------------------------- the proxy's other refusals


def test_a_body_over_the_limit_is_413_before_the_role_and_a_foreign_host_is_400(target):
    books = target.books()
    big = requests.post(
        f"{target.proc.url}/v1/payouts/{target.payout_id}/claim",
        data=b"{" + b" " * (64 * 1024 + 10) + b"}",
        headers={"Content-Type": "application/json"},
        timeout=30,
    )
    assert big.status_code == 413 and big.json()["code"] == "VALIDATION_FAILED"
    foreign = requests.get(
        f"{target.proc.url}/v1/payouts", headers={"Host": "evil.example"}, timeout=30
    )
    assert foreign.status_code == 400
    body = foreign.json()
    assert body["code"] == "VALIDATION_FAILED"
    assert body["details"]["fields"][0]["field"] == "Host"
    assert target.books() == books


def test_probes_and_scrapes_by_pod_ip_are_answered_whatever_the_host(target):
    """Kubelet and Prometheus send Host = the pod's IP: /health/* and /metrics answer it, the
    API under that Host stays refused."""
    pod_ip = {"Host": "10.1.2.3:8080"}
    for path in ("/health/live", "/health/ready", "/metrics"):
        answer = requests.get(f"{target.proc.url}{path}", headers=pod_ip, timeout=30)
        assert answer.status_code == 200, (path, answer.status_code, answer.text[:200])
    api = requests.get(
        f"{target.proc.url}/v1/payouts/{target.payout_id}", headers=pod_ip, timeout=30
    )
    assert api.status_code == 400 and api.json()["details"]["fields"][0]["field"] == "Host"


def test_a_client_stamp_never_reaches_the_role_and_the_proxy_stamps_every_request(target):
    """X-Request-Start is the proxy's: an ancient client copy is replaced (the call is served,
    not shed)."""
    answer = requests.get(
        f"{target.proc.url}/v1/payouts/{target.payout_id}",
        headers={"X-Request-Start": "t=1.000"},
        timeout=30,
    )
    assert answer.status_code == 200, answer.text


def test_the_metrics_and_health_port_is_not_the_api(target):
    """METRICS_PORT unset here: the public port answers both; see test_hardening for the port."""
    assert requests.get(f"{target.proc.url}/metrics", timeout=30).status_code == 200


def test_free_port_never_returns_an_ephemeral_port():
    from devstack.common import RESERVED_PORTS, ephemeral_range

    ephemeral = ephemeral_range()
    given = [free_port() for _ in range(300)]
    assert all(port not in ephemeral and port in RESERVED_PORTS for port in given)
    # ports chosen before anything binds them are still distinct (a stack's 8 ports, say)
    assert len(set(given)) == len(given)


def test_a_bound_listener_holds_a_reserved_port_until_closed():
    from devstack.common import RESERVED_PORTS, bound_listener, ephemeral_range

    with bound_listener() as listener:
        port = listener.getsockname()[1]
        assert port in RESERVED_PORTS and port not in ephemeral_range()
        with pytest.raises(OSError), socket.socket() as other:
            other.bind(("127.0.0.1", port))


def _ports_in_slice(given: str) -> subprocess.CompletedProcess:
    code = (
        "from devstack.common import RESERVED_PORTS as r, free_port\n"
        "print(r.start, r.stop, *(free_port() for _ in range(50)))"
    )
    env = {**os.environ, "DLOCK_PORT_SLICE": given}
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )


def test_parallel_workers_draw_ports_from_disjoint_slices_of_the_reserved_range():
    from devstack.common import FULL_RESERVED_PORTS

    drawn = []
    for given in ("0/2", "1/2"):
        result = _ports_in_slice(given)
        assert result.returncode == 0, result.stderr
        start, stop, *ports = map(int, result.stdout.split())
        assert FULL_RESERVED_PORTS.start <= start < stop <= FULL_RESERVED_PORTS.stop
        assert all(start <= port < stop for port in ports)
        drawn.append(range(start, stop))
    assert drawn[0].stop <= drawn[1].start  # the two workers' slices do not overlap
    for bad in ("2/2", "-1/2", "1/0"):
        assert _ports_in_slice(bad).returncode != 0
