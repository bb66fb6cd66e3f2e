"""A burst of one-shot requests (the rail proxy's forwards: one per gunicorn thread at once)
each still gets a connection of its own, and returning those connections to the pool logs
nothing: a one-shot pool of one kept one and discarded the rest, each with a urllib3 WARNING
("Connection pool is full, discarding connection") — about 165 bytes of the rail proxy's log per
payout in a soak, at WARNING, for nothing wrong."""

from __future__ import annotations

import logging
import socket
import threading
import time

from dlock.http import one_shot_pool, send_once
from tests.loopback import LoopbackServer

BURST = 12
ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"


def slow_answer(conn: socket.socket, _peer: tuple[str, int]) -> None:
    """Reads one request head, waits a little (so the burst overlaps), answers and closes."""
    with conn:
        buffer = b""
        while b"\r\n\r\n" not in buffer:
            chunk = conn.recv(65536)
            if not chunk:
                return
            buffer += chunk
        time.sleep(0.2)
        conn.sendall(ANSWER)


def test_a_burst_of_one_shot_requests_uses_a_connection_each_and_logs_no_discard(caplog):
    server = LoopbackServer(slow_answer)
    statuses: list[int] = []

    def forward() -> None:
        status, _headers, _body = send_once(
            "POST", f"{server.url}/rail", connect_s=1.0, read_s=5.0, body=b"{}", headers={}
        )
        statuses.append(status)

    try:
        with caplog.at_level(logging.WARNING, logger="urllib3.connectionpool"):
            threads = [threading.Thread(target=forward) for _ in range(BURST)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(10)
    finally:
        server.close()
    assert statuses == [200] * BURST
    assert len(server.accepted) == BURST  # one connection per request, none reused
    assert [r.getMessage() for r in caplog.records if "pool is full" in r.getMessage()] == []
    pool = one_shot_pool("http", "127.0.0.1", server.port, {})
    assert pool.pool is not None and pool.pool.qsize() <= 64  # bounded: 64 closed connections
