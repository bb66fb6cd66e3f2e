"""One address's unfinished heads and silent connections do not fill a role's proxy.

nginx's per-address cap on requests in progress (`limit_conn per_client`, http level) counts a
connection only once its request head is read. Before that -- a connection that sent part of a
head, or nothing at all -- nothing at the http level counts it. So the proxy caps connections per
client address at TCP accept, before any byte is read (nginx's `stream` module in front of its
http servers, deploy/nginx/nginx.conf.template): one address holds at most PROXY_TCP_PER_CLIENT
of the proxy's connections, whatever it sends.

The proxies run with their connection counts scaled down (PROXY_WORKER_CONNECTIONS and the caps)
so that the attacker below (127.0.0.2) keeps more connections open than the proxy has; the
honest client is 127.0.0.1. Each honest call is made while the attacker's sockets are held and
refreshed (checked by the holder's round counter before and after, and by the number of sockets
it holds): causal, no wall-clock bound.
"""

from __future__ import annotations

import select
import socket
import threading
import uuid

import pytest
import requests

from devstack.common import free_port
from devstack.roles import RoleProcess
from devstack.tls import ensure_tls
from tests.production.conftest import lockserver_pod, payments_pod, start_probe

pytestmark = [pytest.mark.live, pytest.mark.slow]

SCALED = {  # 3 x 48 (PROXY_TCP_PER_CLIENT: twice 24) + 4 x 64 + 64 = 464 < 512
    "PROXY_WORKER_CONNECTIONS": "512",
    "PROXY_CONN_PER_PROXY": "64",
    "PROXY_CONN_PER_CLIENT": "24",
}
WORKER_CONNECTIONS = int(SCALED["PROXY_WORKER_CONNECTIONS"])
# A partial head: a request line and the start of a header line, never finished.
PARTIAL_HEAD = b"GET /v1/payouts HTTP/1.1\r\nHost: 127.0.0.1\r\nX: "


@pytest.fixture(scope="module")
def payments(tmp_path_factory):
    proc = payments_pod("heads", tmp_path_factory.mktemp("heads"), **SCALED)
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def lockserver(tmp_path_factory):
    proc = lockserver_pod("heads", tmp_path_factory.mktemp("heads-lock"), **SCALED)
    yield proc
    proc.stop()


class Holder:
    """`count` connections from `source`, each having sent `first` (b"": nothing): one the proxy
    closes (its header timeout, or a refusal) is opened again, round after round, so the
    attacker keeps as many as it can open for as long as it runs."""

    def __init__(self, port: int, first: bytes, source: str, count: int) -> None:
        self.port, self.first, self.source, self.count = port, first, source, count
        self.socks: list[socket.socket] = []
        self.rounds = 0
        self.reopened = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._hold, daemon=True)

    def _open(self) -> socket.socket | None:
        try:
            sock = socket.create_connection(
                ("127.0.0.1", self.port), timeout=5, source_address=(self.source, 0)
            )
            if self.first:
                sock.sendall(self.first)
        except OSError:
            return None
        return sock

    def _closed(self) -> list[socket.socket]:
        """The held sockets the proxy closed (readable: EOF or a reset)."""
        closed = []
        for start in range(0, len(self.socks), 500):
            readable, _, _ = select.select(self.socks[start : start + 500], [], [], 0)
            closed.extend(readable)
        return closed

    def _fill(self) -> None:
        for sock in self._closed():
            self.socks.remove(sock)
            sock.close()
            self.reopened += 1
        while len(self.socks) < self.count and not self.stop.is_set():
            sock = self._open()
            if sock is None:
                break
            self.socks.append(sock)

    def __enter__(self) -> Holder:
        self._fill()
        self.thread.start()
        self.wait_rounds(2)
        return self

    def _hold(self) -> None:
        while not self.stop.wait(0.2):
            self._fill()
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


def honest(method: str, url: str, **kwargs) -> requests.Response:
    """One honest call on a new connection from 127.0.0.1; a reset or a refused connection
    fails the test here (requests raises)."""
    return requests.request(method, url, headers={"Connection": "close"}, timeout=30, **kwargs)


def answered_or_overloaded(answer: requests.Response, expected: int) -> None:
    if answer.status_code == 503:
        assert answer.json()["code"] == "OVERLOADED", answer.text
    else:
        assert answer.status_code == expected, answer.text


def honest_call(proc: RoleProcess) -> None:
    if proc.role == "payments":
        answered_or_overloaded(honest("GET", f"{proc.url}/v1/payouts"), 200)
    else:
        session = honest(
            "POST",
            f"{proc.url}/v1/sessions",
            json={"ownerId": f"honest-{uuid.uuid4().hex[:8]}", "ttlMillis": 10_000},
        )
        answered_or_overloaded(session, 201)


@pytest.mark.parametrize("role", ["payments", "lockserver"])
@pytest.mark.parametrize("first", [PARTIAL_HEAD, b""], ids=["partial heads", "silent connects"])
def test_one_address_holding_more_unfinished_connections_than_the_proxy_has_leaves_calls_served(
    request, role, first
):
    """127.0.0.2 keeps opening connections (more than worker_connections) that each send a
    partial head, or nothing, and reopens each one the proxy closes. While it holds them, honest
    calls from 127.0.0.1 are answered (2xx, or the 503 envelope), never reset or refused, and
    the proxy never runs out of connections (without the cap at accept, partial heads reset
    the honest calls; silent connects were drained by nginx, one alert line each)."""
    proc = request.getfixturevalue(role)
    with Holder(proc.port, first, "127.0.0.2", WORKER_CONNECTIONS + 100) as held:
        for _ in range(5):
            before = held.rounds
            honest_call(proc)
            held.wait_rounds(1)
            assert held.rounds > before and held.thread.is_alive()  # held throughout
        assert held.socks  # the attacker holds connections (as many as the proxy lets it)
    # the proxy never ran out of connections (nginx's alert on each accept it cannot serve),
    # and its refusals at accept wrote no line each
    log = proc.proxy_log.read_text(errors="replace") if proc.proxy_log.exists() else ""
    assert "worker_connections are not enough" not in log, log[-2000:]
    assert "limiting connections" not in log, log[-2000:]


# ------------------------------------------------ under TLS, and on the monitoring listener

# The first bytes of a TLS record carrying a ClientHello (handshake, TLS 1.0 record version,
# 512 bytes announced), the rest never sent: a handshake nginx has started and waits on.
PARTIAL_CLIENT_HELLO = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"


@pytest.fixture(scope="module")
def tls_probe(tmp_path_factory):
    """The probe app behind its nginx speaking TLS, with a monitoring listener, scaled down."""
    base = tmp_path_factory.mktemp("heads-tls")
    files = ensure_tls(base / "tls")
    metrics_port = free_port()
    probe = start_probe(
        base,
        tls=(str(files.certificate), str(files.key)),
        DLOCK_CA_BUNDLE=str(files.ca),
        METRICS_PORT=str(metrics_port),
        **SCALED,
    )
    yield probe.role, metrics_port, files
    probe.stop()


@pytest.mark.parametrize("listener", ["role port", "monitoring listener"])
def test_one_address_holding_unfinished_tls_handshakes_leaves_https_calls_served(
    tls_probe, listener
):
    """127.0.0.2 holds more connections than the proxy has, each having sent the start of a
    ClientHello, on the role's TLS port or the monitoring listener. While it holds them, an
    https probe from 127.0.0.1 is answered on the same port."""
    role, metrics_port, files = tls_probe
    port = role.port if listener == "role port" else metrics_port
    with Holder(port, PARTIAL_CLIENT_HELLO, "127.0.0.2", WORKER_CONNECTIONS + 100) as held:
        for _ in range(3):
            before = held.rounds
            answer = requests.get(
                f"https://127.0.0.1:{port}/health/live",
                headers={"Connection": "close"},
                verify=str(files.ca),
                timeout=30,
            )
            assert answer.status_code == 200, answer.text
            held.wait_rounds(1)
            assert held.rounds > before and held.thread.is_alive()
        assert held.socks
    log = role.proxy_log.read_text(errors="replace") if role.proxy_log.exists() else ""
    assert "worker_connections are not enough" not in log, log[-2000:]
