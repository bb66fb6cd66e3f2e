"""Nothing one address (or a few) sends takes a role's proxy down: the per-address cap and the
bound on the sum hold in every server nginx has, the default one (foreign Hosts, probe paths)
included, and an honest caller meets an answer (2xx, or the 503 envelope) at worst, never a
reset.

The proxies run with their connection counts scaled down (PROXY_WORKER_CONNECTIONS,
PROXY_CONN_PER_PROXY, PROXY_CONN_PER_CLIENT) so that the attackers below open more connections
than the proxy has, as the 8 300 of the report did against 8 192. The attackers connect from
127.0.0.2 and up, the honest client from 127.0.0.1. Each honest call is made while the
attackers' sockets are open and still trickling (checked by the trickler's round counter before
and after): causal, no wall-clock bound.
"""

from __future__ import annotations

import os
import socket
import ssl
import subprocess
import threading
import uuid

import pytest
import requests

from devstack import proxy
from devstack.common import free_port
from devstack.roles import RoleProcess
from devstack.tls import ensure_tls
from tests.production.conftest import lockserver_pod, payments_pod, start_probe
from tests.production.test_deploy_artifacts import proxy_container
from tests.production.test_hostile_connections import ending, statuses
from tests.production.test_proxy_limits import assert_envelope, envelope_of, exchange

pytestmark = [pytest.mark.live, pytest.mark.slow]

SCALED = {  # 3 x 64 + 4 x 60 + 64 = 496 < 512 (devstack.proxy.connection_budget)
    "PROXY_WORKER_CONNECTIONS": "512",
    "PROXY_CONN_PER_PROXY": "60",
    "PROXY_CONN_PER_CLIENT": "24",
    "PROXY_TCP_PER_CLIENT": "64",
}
FOREIGN = b"10.42.7.19:8080"


@pytest.fixture(scope="module")
def payments(tmp_path_factory):
    proc = payments_pod("bounds", tmp_path_factory.mktemp("bounds"), **SCALED)
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def lockserver(tmp_path_factory):
    proc = lockserver_pod("bounds", tmp_path_factory.mktemp("bounds-lock"), **SCALED)
    yield proc
    proc.stop()


class Trickle:
    """Sockets from `sources` that each sent `head` and then one body byte every `gap` s."""

    def __init__(self, port: int, head: bytes, sources: list[str], per_source: int) -> None:
        self.port, self.head = port, head
        self.sources, self.per_source = sources, per_source
        self.socks: list[socket.socket] = []
        self.rounds = 0
        self.refused_connects = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._trickle, daemon=True)

    def __enter__(self) -> Trickle:
        for _ in range(self.per_source):
            for source in self.sources:
                try:
                    sock = socket.create_connection(
                        ("127.0.0.1", self.port), timeout=30, source_address=(source, 0)
                    )
                    sock.sendall(self.head)
                except OSError:
                    self.refused_connects += 1
                    continue
                self.socks.append(sock)
        self.thread.start()
        self.wait_rounds(2)
        return self

    def _trickle(self, gap: float = 0.5) -> None:
        while not self.stop.wait(gap):
            for sock in self.socks:
                try:
                    sock.send(b" ")
                except OSError:
                    pass  # closed by the proxy
            self.rounds += 1

    def wait_rounds(self, more: int) -> None:
        target = self.rounds + more
        while self.rounds < target and self.thread.is_alive():
            self.stop.wait(0.05)

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()
        for sock in self.socks:
            sock.close()

    def answers(self) -> list[bytes]:
        """The trickle stopped: what the proxy said on each socket before it closed it."""
        self.stop.set()
        self.thread.join()
        return [ending(sock, 30) for sock in self.socks]


def honest(method: str, url: str, **kwargs) -> requests.Response:
    """One honest call on a new connection from 127.0.0.1; a reset or a refused connection
    fails the test here (requests raises)."""
    return requests.request(method, url, headers={"Connection": "close"}, timeout=30, **kwargs)


def answered_or_overloaded(answer: requests.Response, expected: int) -> None:
    if answer.status_code == 503:
        assert answer.json()["code"] == "OVERLOADED", answer.text
    else:
        assert answer.status_code == expected, answer.text


def probe_post(port: int) -> bytes:
    return (
        b"POST /health/live HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
        b"Content-Length: 200\r\n\r\n{" % FOREIGN
    )


def honest_calls(payments: RoleProcess | None, lockserver: RoleProcess | None) -> None:
    for _ in range(5):
        if payments is not None:
            answered_or_overloaded(honest("GET", f"{payments.url}/v1/payouts"), 200)
            answered_or_overloaded(
                honest("GET", f"{payments.url}/v1/payouts/{payments.payout_id}"), 200
            )
        if lockserver is not None:
            session = honest(
                "POST",
                f"{lockserver.url}/v1/sessions",
                json={"ownerId": f"honest-{uuid.uuid4().hex[:8]}", "ttlMillis": 10_000},
            )
            answered_or_overloaded(session, 201)


@pytest.mark.parametrize("role", ["payments", "lockserver"])
def test_one_address_posting_trickled_bodies_to_a_probe_under_a_foreign_host_leaves_calls_served(
    request, role
):
    """N1: more connections from 127.0.0.2 than the proxy has, each `POST /health/live` with a
    foreign Host and a body trickled a byte every 0.5 s. A probe path is GET/HEAD only: each is
    a 405 envelope with `Allow: GET, HEAD` (or, over the address's cap, the 503 envelope), its
    body never read; while the attacker still trickles, honest calls from 127.0.0.1 are
    answered."""
    proc = request.getfixturevalue(role)
    worker_connections = int(SCALED["PROXY_WORKER_CONNECTIONS"])
    with Trickle(proc.port, probe_post(proc.port), ["127.0.0.2"], worker_connections + 100) as t:
        before = t.rounds
        honest_calls(proc if role == "payments" else None, proc if role == "lockserver" else None)
        t.wait_rounds(1)
        assert t.rounds > before and t.thread.is_alive()  # the attacker trickled throughout
        answers = t.answers()
    refused = {405: 0, 503: 0}
    for answer in answers:
        if answer == b"":
            continue  # its answer lost to the reset of a trickle after the proxy closed
        status = statuses(answer)[0]
        body = assert_envelope(
            answer, status, "VALIDATION_FAILED" if status == 405 else "OVERLOADED"
        )
        assert body["code"]
        if status == 405:
            assert envelope_of(answer)[1]["allow"] == "GET, HEAD"
        refused[status] += 1
    assert refused[405] > 0, refused
    assert t.refused_connects == 0


def test_many_addresses_with_slow_claim_bodies_leave_honest_calls_answered(payments, lockserver):
    """N2: twelve addresses x more slow claim bodies than the sum allows: beyond the per-address
    cap and the per-proxy bound each is the 503 envelope at once; the ones within are held by
    nginx alone. While they are held, honest calls to both roles are answered (2xx, or the 503
    envelope when the sum is full), never reset."""
    sources = [f"127.0.0.{n}" for n in range(2, 14)]  # together over worker_connections
    per_source = int(SCALED["PROXY_WORKER_CONNECTIONS"]) // len(sources) + 20
    claim = (
        b"POST /v1/payouts/%s/claim HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nContent-Length: 600\r\n\r\n{"
        % payments.payout_id.encode()
    )
    session = (
        b"POST /v1/sessions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nContent-Length: 600\r\n\r\n{"
    )
    with (
        Trickle(payments.port, claim, sources, per_source) as on_payments,
        Trickle(lockserver.port, session, sources, per_source) as on_lock,
    ):
        before = (on_payments.rounds, on_lock.rounds)
        honest_calls(payments, lockserver)
        on_payments.wait_rounds(1)
        on_lock.wait_rounds(1)
        assert (on_payments.rounds, on_lock.rounds) > before
        for trickle in (on_payments, on_lock):
            held = [sock for sock in trickle.socks if not _answered(sock)]
            cap = int(SCALED["PROXY_CONN_PER_PROXY"])
            assert 0 < len(held) <= cap  # the bound on the sum holds them, nginx alone
        answers = on_payments.answers() + on_lock.answers()
    overloaded = [a for a in answers if statuses(a)[:1] == [503]]
    assert overloaded
    # a refused request writes no line of its own in the proxy's log (nginx's own alert when
    # the connect burst outran worker_connections for an instant may be there)
    for proc in (payments, lockserver):
        log = proc.proxy_log.read_text(errors="replace") if proc.proxy_log.exists() else ""
        assert "limiting connections" not in log, log[-2000:]
    for answer in overloaded:
        assert_envelope(answer, 503, "OVERLOADED")
    # the held ones were closed by the body timeout, never forwarded
    assert all(a == b"" or statuses(a)[:1] in ([503], [408]) for a in answers), [
        a[:200] for a in answers if a and statuses(a)[:1] not in ([503], [408])
    ][:3]
    assert on_payments.refused_connects == 0 and on_lock.refused_connects == 0


def _answered(sock: socket.socket) -> bool:
    import select

    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))


# ------------------------------------------------------------------ idle keep-alives under TLS


# The nginx sidecar's memory limit as the manifests set it (`<n>Mi`).
SIDECAR_LIMIT_KIB = (
    int(proxy_container("payment-resource")["resources"]["limits"]["memory"].removesuffix("Mi"))
    * 1024
)
IDLE_TLS = 4000


@pytest.fixture(scope="module")
def tls_role(tmp_path_factory):
    """The probe app under the real gunicorn config, behind its nginx speaking TLS with the
    default connection counts (nothing scaled)."""
    base = tmp_path_factory.mktemp("bounds-tls")
    files = ensure_tls(base / "tls")
    tls = (str(files.certificate), str(files.key))
    probe = start_probe(base, tls=tls, DLOCK_CA_BUNDLE=str(files.ca))
    yield probe.role, files
    probe.stop()


def _nginx_rss_kib(pod: subprocess.Popen) -> int:
    """nginx's master and worker together (their shared pages counted twice: an upper bound)."""
    found = subprocess.run(
        ["pgrep", "-g", str(os.getpgid(pod.pid)), "-x", "nginx"],
        capture_output=True,
        text=True,
        check=True,
    )
    total = 0
    for pid in found.stdout.split():
        with open(f"/proc/{pid}/status") as status:
            total += next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
    return total


@pytest.mark.parametrize("addresses", [1, 8], ids=["one address", "eight addresses"])
def test_4000_idle_tls_keep_alives_keep_the_proxy_under_its_memory_limit(tls_role, addresses):
    """4 000 TLS connections from 127.0.0.2 (or from eight addresses, 500 each), each answered
    once and then idle. One address holds at most PROXY_TCP_PER_CLIENT of them (the rest are
    closed at accept); many hold at most what worker_connections allows (nginx closes the oldest
    idle ones when it needs their connections, and each closes at keepalive_timeout anyway). The
    proxy's memory stays under the sidecar's limit while they are open, and an honest call is
    served."""
    role, files = tls_role
    context = ssl.create_default_context(cafile=str(files.ca))
    idle: list[ssl.SSLSocket] = []
    lock = threading.Lock()
    peak = [_nginx_rss_kib(role.process)]

    def open_some(count: int, source: str) -> None:
        for _ in range(count):
            raw = socket.create_connection(
                ("127.0.0.1", role.port), timeout=30, source_address=(source, 0)
            )
            try:
                sock = context.wrap_socket(raw, server_hostname="127.0.0.1")
                sock.sendall(b"GET /health/live HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                answer = sock.recv(65536)
            except OSError:
                raw.close()  # closed at accept, or an idle one closed to make room: allowed
                continue
            if not answer:
                sock.close()  # closed at accept, after the handshake was sent
                continue
            assert statuses(answer)[:1] == [200], answer[:200]
            with lock:
                idle.append(sock)
                if len(idle) % 250 == 0:
                    peak.append(_nginx_rss_kib(role.process))

    sources = [f"127.0.0.{n}" for n in range(2, 2 + addresses)]
    threads = [
        threading.Thread(target=open_some, args=(IDLE_TLS // 4 // len(sources) or 1, source))
        for source in sources
        for _ in range(4)
    ]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        peak.append(_nginx_rss_kib(role.process))
        open_now = sum(1 for sock in idle if not _answered(sock))
        served = requests.get(f"{role.url}/health/live", verify=str(files.ca), timeout=30)
        assert served.status_code == 200
    finally:
        for sock in idle:
            sock.close()
    print(
        f"nginx RSS with {open_now} of {len(idle)} idle TLS keep-alives from {addresses} "
        f"address(es) still open: {max(peak)} KiB (at the start: {peak[0]} KiB)"
    )
    if addresses == 1:
        assert 0 < open_now <= proxy.tcp_per_client({})
    else:
        assert open_now > proxy.tcp_per_client({})
    assert max(peak) < SIDECAR_LIMIT_KIB, peak


# ------------------------------------------------------------------------------- 405s say Allow


@pytest.mark.parametrize("host", [b"127.0.0.1", FOREIGN], ids=["own Host", "foreign Host"])
@pytest.mark.parametrize("method", [b"POST", b"PUT", b"DELETE", b"OPTIONS", b"PATCH"])
def test_a_probe_path_answers_get_and_head_only_and_says_so(payments, host, method):
    for path in (b"/health/live", b"/health/ready", b"/metrics"):
        request = b"%s %s HTTP/1.1\r\nHost: %s\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"
        answer = exchange(payments.port, request % (method, path, host))
        assert_envelope(answer, 405, "VALIDATION_FAILED")
        assert envelope_of(answer)[1]["allow"] == "GET, HEAD"
    head = exchange(
        payments.port, b"HEAD /health/live HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" % host
    )
    assert statuses(head) == [200], head


def test_a_method_no_route_has_is_a_405_that_lists_the_methods_there_are(payments):
    answer = exchange(
        payments.port, b"TRACE /v1/payouts HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    assert_envelope(answer, 405, "VALIDATION_FAILED")
    assert envelope_of(answer)[1]["allow"] == "DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT"


def test_the_monitoring_listener_has_the_per_address_cap_and_answers_get_and_head_only(tmp_path):
    """The metrics port (k8s: 9100) is a server of its own: the per-address cap holds there too
    (four GETs of /metrics whose bodies are still arriving fill 127.0.0.2's share: a fifth is the
    503 envelope, while 127.0.0.1 is served), and a POST is the 405 with `Allow: GET, HEAD`."""
    metrics_port = free_port()
    probe = start_probe(tmp_path, METRICS_PORT=str(metrics_port), PROXY_CONN_PER_CLIENT="4")
    slow = b"GET /metrics HTTP/1.1\r\nHost: 10.1.2.3:9100\r\nContent-Length: 100\r\n\r\n{"
    try:
        with Trickle(metrics_port, slow, ["127.0.0.2"], 4) as held:
            before = held.rounds
            with socket.create_connection(
                ("127.0.0.1", metrics_port), timeout=30, source_address=("127.0.0.2", 0)
            ) as fifth:
                fifth.sendall(
                    b"GET /metrics HTTP/1.1\r\nHost: 10.1.2.3:9100\r\nConnection: close\r\n\r\n"
                )
                assert_envelope(ending(fifth, 30), 503, "OVERLOADED")
            honest = requests.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=30)
            assert honest.status_code == 200
            held.wait_rounds(1)
            assert held.rounds > before  # the four kept trickling throughout
            assert not any(_answered(sock) for sock in held.socks)  # and were held
        post = exchange(
            metrics_port,
            b"POST /health/live HTTP/1.1\r\nHost: 10.1.2.3:9100\r\nContent-Length: 0\r\n"
            b"Connection: close\r\n\r\n",
        )
        assert_envelope(post, 405, "VALIDATION_FAILED")
        assert envelope_of(post)[1]["allow"] == "GET, HEAD"
    finally:
        probe.stop()
