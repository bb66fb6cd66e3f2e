"""dlock.http's per-call shortcuts keep the transport's behaviour: the Accept-Encoding the wire
carries, header checks remembered per name, origins parsed once per `scheme://authority`, and
the one Retry/Timeout objects shared by every call (a real loopback peer; the bytes it read)."""

from __future__ import annotations

import socket
import threading

import pytest

from dlock.budgets import Budget
from dlock.http import TransportError, exchange, pool_for, send_once
from tests.loopback import LoopbackServer

FAST = Budget(0.5, 1.0, 0, "test")
ANSWER = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


class RecordingPeer(LoopbackServer):
    """Answers every request `{}` on a keep-alive connection and keeps each request's head."""

    def __init__(self) -> None:
        self.heads: list[bytes] = []
        self.lock = threading.Lock()
        super().__init__(self.serve)

    def serve(self, conn: socket.socket, _peer: tuple[str, int]) -> None:
        buffer = b""
        with conn:
            while True:
                while b"\r\n\r\n" not in buffer:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buffer += chunk
                head, _, rest = buffer.partition(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":", 1)[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    ),
                    0,
                )
                while len(rest) < length:
                    rest += conn.recv(65536)
                buffer = rest[length:]
                with self.lock:
                    self.heads.append(head)
                conn.sendall(ANSWER)


@pytest.fixture
def recording():
    server = RecordingPeer()
    yield server
    server.close()


def _fields(head: bytes, name: bytes) -> list[bytes]:
    return [
        line.split(b":", 1)[1].strip()
        for line in head.split(b"\r\n")[1:]
        if line.split(b":", 1)[0].strip().lower() == name
    ]


def test_every_request_asks_for_an_identity_body_once(recording):
    exchange("POST", f"{recording.url}/v1/x", hop=FAST, json_body={"a": 1})
    send_once("POST", f"{recording.url}/rail", connect_s=0.5, read_s=1.0, body=b"{}", headers={})
    send_once(
        "POST",
        f"{recording.url}/rail",
        connect_s=0.5,
        read_s=1.0,
        body=b"{}",
        headers={"accept-encoding": "br"},
    )
    first, second, third = recording.heads
    assert _fields(first, b"accept-encoding") == [b"identity"]
    assert _fields(second, b"accept-encoding") == [b"identity"]
    assert _fields(third, b"accept-encoding") == [b"br"]  # the caller's, not ours as well


def test_a_bad_header_is_refused_unsent_after_good_ones_with_its_own_name(recording):
    exchange("GET", f"{recording.url}/a", hop=FAST, headers={"X-Good": "1"})
    with pytest.raises(TransportError) as bad_name:
        exchange("GET", f"{recording.url}/b", hop=FAST, headers={"X-Good": "1", "X Bad": "1"})
    with pytest.raises(TransportError) as bad_value:
        exchange(
            "GET",
            f"{recording.url}/c",
            hop=FAST,
            headers={"X-Good": "1", "X-Split": "a\r\nX-Evil: 1", "X-Late": "2"},
        )
    assert bad_name.value.sent is False and "'X Bad'" in str(bad_name.value)
    assert bad_value.value.sent is False and "'X-Split'" in str(bad_value.value)
    assert len(recording.heads) == 1  # only the first request was written


def test_urls_of_one_origin_share_its_pool_and_bad_ones_are_refused_each_time(recording):
    assert pool_for(f"{recording.url}/a") is pool_for(f"{recording.url}/b/c?d=1#e")
    assert pool_for(f"{recording.url}/a") is not pool_for(f"http://localhost:{recording.port}/")
    for url in ("ftp://127.0.0.1/x", "http://127.0.0.1:99999/x", "no-scheme/x", "http:///x"):
        for _ in range(2):  # a refused origin is never remembered as a good one
            with pytest.raises(TransportError) as caught:
                exchange("GET", url, hop=FAST)
            assert caught.value.sent is False


def test_calls_with_different_budgets_each_get_their_answer(recording):
    for read_s in (0.2, 0.7, 1.3, 0.2):
        reply = exchange("GET", f"{recording.url}/x", hop=Budget(0.5, read_s, 0, "test"))
        assert reply.status == 200 and reply.body == {}
    assert len(recording.heads) == 4
