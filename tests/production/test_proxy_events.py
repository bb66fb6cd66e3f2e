"""What a role's proxy answers itself reaches the on-call as aggregated events, never a line
each: nginx sends one datagram per refusal to the role (deploy/nginx/events-on.conf.template),
the role writes at most one `proxy_refused` line a second per reason and server with the count,
and `dlock_proxy_refusals_total{reason}` moves by the same count (dlock.edge_events).

Real nginx and a real payment-resource pod. The attacker connects from 127.0.0.2. Waiting is
causal: after a spray, one request of another reason (a TRACE: `method`) is sent from the same
proxy; datagrams of one nginx worker arrive in order, so once that reason's line is in the log,
every line of the spray before it is too.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import time

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from devstack import proxy
from devstack.common import free_port
from devstack.roles import RoleProcess, new_pod_dir, remove_pod_dir
from dlock.edge_events import DATAGRAM_BYTES, PROXY_REFUSAL_REASONS, parse
from tests.production.conftest import migrated_paydb, payments_pod
from tests.production.test_hostile_connections import ending, statuses

pytestmark = [pytest.mark.live, pytest.mark.slow]

ATTACKER = "127.0.0.2"
FOREIGN = b"10.42.7.19:8080"
CAP = 8  # PROXY_CONN_PER_CLIENT of the pod below
SPRAY = 300


@pytest.fixture(scope="module")
def payments(tmp_path_factory):
    proc = payments_pod("events", tmp_path_factory.mktemp("events"), PROXY_CONN_PER_CLIENT=str(CAP))
    yield proc
    proc.stop()


def send(port: int, request: bytes, source: str = ATTACKER) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=30, source_address=(source, 0)) as s:
        s.sendall(request)
        return ending(s, 30)


def probe_post(port: int) -> bytes:
    """POST to a probe path under a foreign Host: the default server's 405 (GET/HEAD only)."""
    return send(
        port,
        b"POST /health/live HTTP/1.1\r\nHost: %s\r\nContent-Length: 5\r\n"
        b"Connection: close\r\n\r\nhello" % FOREIGN,
    )


def refused_lines(proc: RoleProcess, since: int = 0) -> list[dict]:
    lines = []
    with proc.logfile.open("rb") as fh:
        fh.seek(since)
        for raw in fh:
            if b'"proxy_refused"' not in raw:
                continue
            line = json.loads(raw)
            if line.get("event") == "proxy_refused":
                lines.append(line)
    return lines


def marker_seen(proc: RoleProcess, since: int, timeout: float = 30) -> list[dict]:
    """Send one TRACE (reason `method`) after the spray and read the log until its line is
    there; the lines from `since` on."""
    answer = send(
        proc.port, b"TRACE /v1/payouts HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    assert statuses(answer) == [405], answer
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = refused_lines(proc, since)
        if any(line["reason"] == "method" for line in lines):
            return lines
        time.sleep(0.1)
    raise AssertionError(f"no `method` line within {timeout} s: {refused_lines(proc, since)}")


def refusals_metric(proc: RoleProcess) -> dict[str, float]:
    text = requests.get(f"{proc.url}/metrics", timeout=30).text
    for family in text_string_to_metric_families(text):
        if family.name == "dlock_proxy_refusals":
            return {
                s.labels["reason"]: s.value for s in family.samples if s.name.endswith("_total")
            }
    raise AssertionError("dlock_proxy_refusals_total is not exported")


def test_every_refusal_reason_is_exported_at_zero_from_start_up(payments):
    assert set(refusals_metric(payments)) == set(PROXY_REFUSAL_REASONS)


def test_a_spray_of_probe_posts_under_a_foreign_host_is_a_few_lines_whose_counts_add_up(
    payments,
):
    since = payments.logfile.stat().st_size
    proxy_log = payments.proxy_log.stat().st_size if payments.proxy_log.exists() else 0
    before = refusals_metric(payments)
    answers = [probe_post(payments.port) for _ in range(SPRAY)]
    assert all(statuses(a) == [405] for a in answers), answers[:2]

    lines = [line for line in marker_seen(payments, since) if line["reason"] == "probe_method"]
    counted = sum(line["count"] for line in lines)
    # a floor (a datagram the receiver had no room for is dropped) and never more
    assert SPRAY * 0.9 <= counted <= SPRAY, (counted, lines)
    assert len(lines) <= SPRAY // 10, len(lines)
    for line in lines:
        assert line["server"] == "default" and line["status"] == 405 and line["level"] == "WARNING"
        assert set(line["clients"]) == {ATTACKER}
    after = refusals_metric(payments)
    assert after["probe_method"] - before["probe_method"] == counted
    # nginx's own error log wrote no line per refusal
    text = payments.proxy_log.read_bytes()[proxy_log:] if payments.proxy_log.exists() else b""
    assert text.count(b"\n") < 3, text[-2000:]


def test_connections_over_the_per_address_cap_are_counted_as_overloaded(payments):
    since = payments.logfile.stat().st_size
    before = refusals_metric(payments)
    head = (
        b"POST /v1/payouts/%s/claim HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nContent-Length: 600\r\n\r\n{"
        % payments.payout_id.encode()
    )
    held = []
    for _ in range(CAP):
        sock = socket.create_connection(
            ("127.0.0.1", payments.port), timeout=30, source_address=(ATTACKER, 0)
        )
        sock.sendall(head)
        held.append(sock)
    try:
        over = 100
        answers = [
            send(
                payments.port,
                b"GET /v1/payouts HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
            )
            for _ in range(over)
        ]
    finally:
        for sock in held:
            sock.close()
    refused = sum(1 for a in answers if statuses(a) == [503])
    assert refused > over // 2, [a[:100] for a in answers[:3]]
    lines = [line for line in marker_seen(payments, since) if line["reason"] == "overloaded"]
    counted = sum(line["count"] for line in lines)
    assert refused * 0.9 <= counted <= refused, (refused, lines)
    assert all(line["server"] == "role" and line["status"] == 503 for line in lines)
    assert refusals_metric(payments)["overloaded"] - before["overloaded"] == counted


def test_connections_closed_at_accept_over_the_address_cap_are_counted(payments):
    """Over PROXY_TCP_PER_CLIENT (2 × CAP here) the stream hop closes a connection at accept,
    before any byte: one datagram each (stream-events-on.conf), reason
    `connections_per_client`, while the held ones are still open."""
    since = payments.logfile.stat().st_size
    before = refusals_metric(payments)
    held = []
    try:
        for _ in range(2 * CAP):
            sock = socket.create_connection(
                ("127.0.0.1", payments.port), timeout=30, source_address=(ATTACKER, 0)
            )
            sock.sendall(b"GET /v1/payouts HTTP/1.1\r\nHost: 127.0.0.1\r\nX: ")
            held.append(sock)
        over = 40
        closed = 0
        for _ in range(over):
            with socket.create_connection(
                ("127.0.0.1", payments.port), timeout=30, source_address=(ATTACKER, 0)
            ) as sock:
                try:
                    closed += sock.recv(1) == b""
                except ConnectionResetError:
                    closed += 1
        # an honest caller from another address is answered meanwhile
        honest = send(
            payments.port,
            b"GET /health/live HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
            source="127.0.0.1",
        )
        assert statuses(honest) == [200], honest[:200]
    finally:
        for sock in held:
            sock.close()
    assert closed == over
    lines = [
        line for line in marker_seen(payments, since) if line["reason"] == "connections_per_client"
    ]
    counted = sum(line["count"] for line in lines)
    assert over * 0.9 <= counted <= over, (over, lines)
    assert all(line["server"] == "role" and line["status"] == 503 for line in lines), lines
    assert all(set(line["clients"]) == {ATTACKER} for line in lines), lines
    after = refusals_metric(payments)
    assert after["connections_per_client"] - before["connections_per_client"] == counted


def test_two_workers_share_the_port_and_their_counts_add_up(tmp_path):
    """GUNICORN_WORKERS=2: the master holds the port, both workers read it, each writes its
    own lines; together they count the spray once, and /metrics sums both workers' counts."""
    directory = tmp_path / "prom"
    directory.mkdir()
    _, env = migrated_paydb(
        "events2", GUNICORN_WORKERS="2", PROMETHEUS_MULTIPROC_DIR=str(directory)
    )
    proc = RoleProcess("payments", free_port(), env, tmp_path / "payments.log").start()
    try:
        before = refusals_metric(proc)["foreign_host"]
        request = b"GET /v1/payouts HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n"
        answers = [send(proc.port, request) for _ in range(SPRAY)]
        assert all(statuses(a) == [400] for a in answers), answers[:2]
        deadline = time.monotonic() + 30
        while True:  # each worker flushes its own share within its period
            lines = [line for line in refused_lines(proc) if line["reason"] == "foreign_host"]
            counted = sum(line["count"] for line in lines)
            moved = refusals_metric(proc)["foreign_host"] - before
            if (counted >= SPRAY * 0.9 and moved == counted) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    finally:
        proc.stop()
    assert SPRAY * 0.9 <= counted <= SPRAY, (counted, lines)
    assert moved == counted
    assert all(line["server"] == "default" for line in lines)  # no server has that name
    assert len(lines) <= SPRAY // 10, len(lines)


def test_a_role_that_stops_right_after_a_spray_writes_what_it_counted(tmp_path):
    """The pod is stopped as soon as the spray was answered, without waiting for a period:
    the exiting worker writes its last counts (gunicorn's worker_exit), so none is lost."""
    _, env = migrated_paydb("events_stop")
    proc = RoleProcess("payments", free_port(), env, tmp_path / "payments.log").start()
    try:
        answers = [probe_post(proc.port) for _ in range(SPRAY // 3)]
    finally:
        proc.stop()
    assert all(statuses(a) == [405] for a in answers), answers[:2]
    lines = [line for line in refused_lines(proc) if line["reason"] == "probe_method"]
    # a floor: the last answer's datagram may still be on its way while nginx quits
    assert len(answers) - 1 <= sum(line["count"] for line in lines) <= len(answers), lines


def test_hostile_datagrams_to_the_events_port_are_dropped(payments):
    """Anything on the port that is not exactly the proxy's format moves nothing."""
    since = payments.logfile.stat().st_size
    before = refusals_metric(payments)
    port = int(payments.started_env["PROXY_EVENTS_PORT"])
    header = b"<190>Dec  6 15:19:04 dlock_edge: dlock-edge-1 "
    hostile = [
        header + b"evil_reason role 400 127.0.0.9",  # a reason outside the fixed set
        header + b"overloaded pod 503 127.0.0.9",  # a server outside the fixed set
        header + b"overloaded role 503 not-an-address",
        header + b"overloaded role 503 127.0.0.9 extra",
        header + b"overloaded role 503 127.0.0.9" + b" " * DATAGRAM_BYTES,  # oversized
        b"\xff\xfe" * 300,
        b"",
    ]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        for datagram in hostile:
            udp.sendto(datagram, ("127.0.0.1", port))
    lines = marker_seen(payments, since)
    assert [line["reason"] for line in lines] == ["method"], lines
    after = refusals_metric(payments)
    assert {r: after[r] - before[r] for r in after if after[r] != before[r]} == {"method": 1}


def test_parse_takes_only_the_proxys_own_format():
    good = b"<190>Dec  6 15:19:04 dlock_edge: dlock-edge-1 foreign_host default 400 ::1"
    answer = parse(good)
    assert answer is not None
    assert (answer.reason, answer.server, answer.status, answer.client) == (
        "foreign_host",
        "default",
        400,
        "::1",
    )
    assert parse(good.replace(b"foreign_host", b"FOREIGN")) is None
    assert parse(good.replace(b"dlock_edge", b"other_tag")) is None
    assert parse(good + b"\n\x00") is None


@contextlib.contextmanager
def proxy_alone(events_port: int, **env: str):
    """The payments role's nginx with no role behind it (its upstream socket does not exist),
    sending its datagrams to `events_port`; yields (port, metrics port, error log)."""
    port, metrics_port = free_port(), free_port()
    pod = new_pod_dir("events-alone", port)
    error_log = pod / "error.log"
    config = proxy.ProxyConfig(
        role="payments",
        listen=f"127.0.0.1:{port}",
        upstream=f"unix:{pod / 'nowhere.sock'}",
        error_log=str(error_log),
        env={"PROXY_EVENTS_PORT": str(events_port), **env},
        metrics_listen=f"127.0.0.1:{metrics_port}",
    )
    conf = proxy.fill(pod, config)
    user = proxy.worker_user()
    main = "daemon off;" + (f" user {user};" if user else "")
    command = [proxy.NGINX, "-p", str(pod), "-c", str(conf), "-e", str(error_log), "-g", main]
    nginx = subprocess.Popen(command)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline and nginx.poll() is None, "nginx not up"
                time.sleep(0.05)
        yield port, metrics_port, error_log
    finally:
        nginx.terminate()
        nginx.wait(30)
        remove_pod_dir(pod)


def proxy_and_receiver(stack: contextlib.ExitStack, **env: str):
    """A UDP socket standing in for the role, and `proxy_alone` sending to it, both closed with
    `stack`: (the socket, what proxy_alone yields)."""
    udp = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
    events_port = free_port()
    udp.bind(("127.0.0.1", events_port))
    udp.settimeout(10)
    return udp, stack.enter_context(proxy_alone(events_port, **env))


# What a client sends, and the reason and server the proxy's datagram must name.
ANSWERS = [
    (b"GET /v1/payouts HTTP/1.1\r\nHost: evil.example\r\n", "foreign_host", "default", 400),
    (
        b"GET http://evil.example/v1/payouts HTTP/1.1\r\nHost: 127.0.0.1\r\n",
        "foreign_host",
        "default",
        400,
    ),
    (b"POST /health/live HTTP/1.1\r\nHost: 127.0.0.1\r\n", "probe_method", "role", 405),
    (b"TRACE /v1/payouts HTTP/1.1\r\nHost: 127.0.0.1\r\n", "method", "role", 405),
    (
        b"POST /v1/payouts HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n",
        "chunked_body",
        "role",
        411,
    ),
    (
        b"GET /v1/payouts HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: a\x01b\r\n",
        "header_control",
        "role",
        400,
    ),
    (
        b"POST /v1/payouts/x/claim HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 5000\r\n",
        "body_too_large",
        "role",
        413,
    ),
    (b"GET /" + b"a" * 5000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n", "uri_too_long", "default", 414),
    (
        b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"b" * 5000 + b"\r\n",
        "header_too_large",
        "role",
        431,
    ),
    (b"GET /\x00 HTTP/1.1\r\nHost: 127.0.0.1\r\n", "bad_request", "default", 400),
    (b"GET / HTTP/2.0\r\nHost: 127.0.0.1\r\n", "http_version", "default", 400),
    (b"GET /_dlock/503 HTTP/1.1\r\nHost: 127.0.0.1\r\n", "not_found", "role", 404),
    (b"GET /v1/payouts HTTP/1.1\r\nHost: 127.0.0.1\r\n", "upstream_unreachable", "role", 503),
]


def test_each_answer_the_proxy_makes_itself_is_one_datagram_naming_its_reason():
    with contextlib.ExitStack() as stack:
        udp, (port, metrics_port, _) = proxy_and_receiver(stack)
        for request, reason, server, status in ANSWERS:
            answer = send(port, request + b"Connection: close\r\n\r\n", source="127.0.0.1")
            assert statuses(answer)[:1] == [status], (reason, answer[:300])
            got = parse(udp.recv(DATAGRAM_BYTES))
            assert got is not None and (got.reason, got.server, got.status, got.client) == (
                reason,
                server,
                status,
                "127.0.0.1",
            ), request[:80]
        # the monitoring listener's other paths
        send(metrics_port, b"GET /v1/payouts HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        got = parse(udp.recv(DATAGRAM_BYTES))
        assert got is not None and (got.reason, got.server) == ("not_found", "metrics")
        # a client that hangs up mid-body was answered nothing: no datagram for it
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.sendall(
                b"POST /v1/payouts HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 50\r\n\r\n{"
            )
        marker = send(port, b"TRACE / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        assert statuses(marker) == [405]
        got = parse(udp.recv(DATAGRAM_BYTES))
        assert got is not None and got.reason == "method", got


def test_over_the_per_address_cap_the_datagram_says_overloaded():
    with contextlib.ExitStack() as stack:
        udp, (port, _, _) = proxy_and_receiver(stack, PROXY_CONN_PER_CLIENT="1")
        held = socket.create_connection(("127.0.0.1", port), timeout=30)
        stack.callback(held.close)
        held.sendall(b"POST /v1/payouts HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 50\r\n\r\n{")
        request = b"GET /v1/payouts HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
        reasons = []
        while "overloaded" not in reasons and len(reasons) < 20:  # until nginx holds `held`
            assert statuses(send(port, request, source="127.0.0.1")) == [503]
            got = parse(udp.recv(DATAGRAM_BYTES))
            assert got is not None and (got.server, got.status) == ("role", 503), got
            reasons.append(got.reason)
        # before nginx counted `held`, the request went on and found no role
        assert set(reasons) <= {"upstream_unreachable", "overloaded"}
        assert reasons[-1] == "overloaded", reasons


def test_with_no_receiver_a_spray_of_refusals_writes_nothing_in_the_proxys_error_log():
    """The proxy alone (its role not running): nothing listens on the events port, so every
    other datagram comes back as a refused send, which nginx logs at `error`, below its log's
    level: the error log stays empty however many refusals."""
    with proxy_alone(free_port()) as (port, _, error_log):
        for _ in range(100):
            assert statuses(probe_post(port)) == [405]
            big = send(
                port,
                b"POST /v1/payouts/x/claim HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Content-Length: 5000\r\nConnection: close\r\n\r\n",
            )
            assert statuses(big) == [413]
            foreign = send(
                port, b"GET /v1/payouts HTTP/1.1\r\nHost: evil\r\nConnection: close\r\n\r\n"
            )
            assert statuses(foreign) == [400]
        text = error_log.read_text(errors="replace") if error_log.exists() else ""
    assert text == "", text[-2000:]
