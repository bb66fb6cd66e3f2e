"""The proxy's forward to the rail on real loopback sockets: one fresh TCP connection per
submission, the connect/read timeout split, and how each failure is classified."""

from __future__ import annotations

import json
import socket
import threading
import uuid

import pytest

from devstack.common import free_port
from railproxy.models import Outcome
from railproxy.rail_call import forward
from railproxy.submission import SubmissionRequest
from tests.loopback import LoopbackServer

ACK = json.dumps({"railReference": "RR-1", "acceptedAt": "2026-12-01T00:00:00.000Z"}).encode()


class RawRail(LoopbackServer):
    """A socket server that records each connection's peer and the requests read on it,
    serving one connection at a time."""

    def __init__(self, behaviour: str = "ack") -> None:
        self.behaviour = behaviour
        self.connections: list[tuple[tuple[str, int], bytes]] = []
        self.gave_up = threading.Event()  # "trickle": it ran out of bytes before the client did
        super().__init__(self._serve, threaded=False)

    def _serve(self, conn: socket.socket, peer: tuple[str, int]) -> None:
        with conn:
            conn.settimeout(5)
            received = b""
            while b"\r\n\r\n" not in received:
                received += conn.recv(4096)
            head, _, rest = received.partition(b"\r\n\r\n")
            length = int(
                next(
                    line.split(b":", 1)[1]
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
            )
            while len(rest) < length:
                rest += conn.recv(4096)
            received = head + b"\r\n\r\n" + rest
            if self.behaviour == "trickle":  # a 200 head, then a byte every 50 ms
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b"Content-Length: 1000\r\n\r\n"
                )
                try:
                    for _ in range(100):
                        threading.Event().wait(0.05)
                        conn.sendall(b" ")
                    self.gave_up.set()
                except OSError:
                    pass
            elif self.behaviour == "silent":
                conn.recv(1)  # hold the connection, answer nothing
            elif self.behaviour in ("ack", "deep"):
                ack = ACK if self.behaviour == "ack" else b"[" * 100_000 + b"]" * 100_000
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (len(ack), ack)
                )
                # Keep the connection open: a client that wanted to reuse it could.
                try:
                    conn.recv(4096)
                except OSError:
                    pass
            self.connections.append((peer, received))


def _request() -> SubmissionRequest:
    return SubmissionRequest(
        payout_id=uuid.uuid4(),
        account_id="acct-1",
        amount_minor=125,
        currency="EUR",
        beneficiary_ref="ben-1",
        token=7,
        owner_id="worker-1",
        idempotency_key="k",
    )


@pytest.fixture
def raw_rail(settings):
    servers: list[RawRail] = []

    def start(behaviour: str = "ack") -> RawRail:
        server = RawRail(behaviour)
        servers.append(server)
        settings.RAIL_STUB_URL = f"http://127.0.0.1:{server.port}"
        return server

    yield start
    for server in servers:
        server.close()


def test_two_submissions_never_share_a_tcp_connection(raw_rail):
    rail = raw_rail("ack")

    first = forward(request=_request(), submission_id=uuid.uuid4())
    second = forward(request=_request(), submission_id=uuid.uuid4())

    assert first.outcome == Outcome.ACKED and first.rail_reference == "RR-1"
    assert second.outcome == Outcome.ACKED
    for _ in range(100):
        if len(rail.connections) == 2:
            break
        threading.Event().wait(0.02)
    peers = [peer for peer, _ in rail.connections]
    assert len(peers) == 2 and peers[0][1] != peers[1][1], peers
    # Exactly one request on each connection, the body as the rail contract spells it.
    for _, received in rail.connections:
        assert received.count(b"POST /submit HTTP/1.1") == 1
        body = json.loads(received.partition(b"\r\n\r\n")[2])
        assert set(body) == {"clientRef", "amountMinor", "currency"}
        assert b"traceparent: 00-" in received


def test_a_refused_connect_is_provably_not_sent(settings):
    port = free_port()  # nothing listens there: the connect is refused
    settings.RAIL_STUB_URL = f"http://127.0.0.1:{port}"

    answer = forward(request=_request(), submission_id=uuid.uuid4())

    assert (answer.outcome, answer.detail) == (Outcome.NOT_SENT, "connect_failed")


def test_silence_after_the_bytes_left_is_a_read_timeout_not_the_connect_timeout(raw_rail, settings):
    rail = raw_rail("silent")
    settings.RAIL_CONNECT_TIMEOUT_MS = 5_000
    settings.RAIL_READ_TIMEOUT_MS = 300

    answer = forward(request=_request(), submission_id=uuid.uuid4())

    assert (answer.outcome, answer.detail) == (Outcome.TIMEOUT, "read_timeout")
    rail.close()


def test_a_connection_closed_after_the_request_is_ambiguous(raw_rail):
    raw_rail("drop")

    answer = forward(request=_request(), submission_id=uuid.uuid4())

    assert (answer.outcome, answer.detail) == (Outcome.TIMEOUT, "connection_lost")


def test_a_rail_that_trickles_its_answer_times_out_within_the_read_budget(raw_rail, settings):
    """RAIL_READ_TIMEOUT_MS bounds the whole answer, not each read: a byte every 50 ms would
    satisfy a per-read timeout of 300 ms for the 5 s this rail keeps it up (and for ever, a
    worse one), holding the proxy past the request deadline its callers' budgets assume."""
    rail = raw_rail("trickle")
    settings.RAIL_CONNECT_TIMEOUT_MS = 5_000
    settings.RAIL_READ_TIMEOUT_MS = 300

    answer = forward(request=_request(), submission_id=uuid.uuid4())

    assert (answer.outcome, answer.detail) == (Outcome.TIMEOUT, "read_timeout")
    assert not rail.gave_up.is_set()  # the proxy gave up first, on its own budget


def test_a_200_nested_past_the_parsers_depth_is_a_malformed_ack_not_a_crash(raw_rail):
    # The standard library's json recurses into every bracket and raises RecursionError, not
    # ValueError: the answer must still be classified (ambiguous, quarantined), not raise after
    # the intent was committed.
    raw_rail("deep")

    answer = forward(request=_request(), submission_id=uuid.uuid4())

    assert (answer.outcome, answer.detail) == (Outcome.TIMEOUT, "malformed_ack")
