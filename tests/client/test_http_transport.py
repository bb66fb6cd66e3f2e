"""dlock.http (urllib3 underneath) against scripted HTTP peers on loopback: framing, keep-alive,
retries off, TLS verification, and what `sent` means.

Each test starts a real TCP server whose answers are raw bytes, so a peer can misbehave in ways
gunicorn never does (chunked bodies, 1xx, a close mid-response, junk, silence) and the test can
count the connections it accepted. `sent=False` must mean that no request byte reached the peer.
"""

from __future__ import annotations

import functools
import json
import os
import pathlib
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Callable

import pytest

from devstack.common import free_port
from dlock.budgets import Budget
from dlock.client import (
    DlockError,
    Endpoints,
    InternalError,
    LockContended,
    Overloaded,
    ServiceUnreachable,
    call,
    changed_nothing,
)
from dlock.http import ConnectionPool, exchange
from tests.loopback import LoopbackServer

FAST = Budget(0.5, 1.0, 0, "test")
Answer = Callable[[int, bytes], bytes | None]  # (request number, request bytes) → bytes to send


class Close(bytes):
    """An answer after which the peer closes the connection (as a keep-alive timeout does)."""


def _json(status: int, body: bytes, *extra: str, version: str = "1.1") -> bytes:
    head = [f"HTTP/{version} {status} X", "Content-Type: application/json", *extra]
    head.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


class ScriptedPeer(LoopbackServer):
    """Accepts connections; reads each request (head + Content-Length body); sends `answer`'s
    bytes (None: close without answering). Records every request and connection."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.requests: list[bytes] = []
        self._mutex = threading.Lock()
        self.serve: Callable[[socket.socket], None] | None = None  # answers by hand when set
        super().__init__(lambda conn, _: (self.serve or self._serve)(conn))

    @property
    def connections(self) -> int:
        return len(self.accepted)

    def _serve(self, conn: socket.socket) -> None:
        buffer = b""
        with conn:
            while True:
                while b"\r\n\r\n" not in buffer:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buffer += chunk
                head, _, rest = buffer.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                while len(rest) < length:
                    rest += conn.recv(65536)
                request, buffer = head + b"\r\n\r\n" + rest[:length], rest[length:]
                with self._mutex:
                    self.requests.append(request)
                    number = len(self.requests)
                reply = self.answer(number, request)
                if reply is None:
                    return
                conn.sendall(reply)
                if isinstance(reply, Close):
                    return


@pytest.fixture
def peer():
    peers: list[ScriptedPeer] = []

    def start(answer: Answer) -> ScriptedPeer:
        peers.append(ScriptedPeer(answer))
        return peers[-1]

    yield start
    for p in peers:
        p.close()


def test_calls_reuse_one_keep_alive_connection(peer):
    server = peer(lambda n, _: _json(200, b'{"n":%d}' % n))
    bodies = [exchange("GET", f"{server.url}/v1/x", hop=FAST).body for _ in range(5)]
    assert bodies == [{"n": 1}, {"n": 2}, {"n": 3}, {"n": 4}, {"n": 5}]
    assert server.connections == 1


def test_a_request_is_one_http_1_1_message_with_the_dlock_headers(peer):
    server = peer(lambda n, _: _json(200, b"{}"))
    exchange(
        "POST",
        f"{server.url}/v1/locks/payout:acc-1/acquire",
        hop=FAST,
        owner_id="worker-1",
        json_body={"sessionId": "s", "ttlMillis": 5000, "ref": "é"},
        headers={"X-Fencing-Token": "7", "x-owner-id": "worker-2"},
    )
    exchange("DELETE", f"{server.url}/v1/locks/k", hop=FAST, params={"sessionId": "a b&c"})
    post, delete = server.requests
    head, _, body = post.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0] == "POST /v1/locks/payout:acc-1/acquire HTTP/1.1"
    fields = {line.split(":", 1)[0].lower(): line.split(":", 1)[1].strip() for line in lines[1:]}
    assert fields["host"] == server.url.removeprefix("http://")
    assert fields["x-owner-id"] == "worker-2"  # the caller's header wins, whatever its case
    assert [line for line in lines if line.lower().startswith("x-owner-id")] == [
        "x-owner-id: worker-2"
    ]
    assert fields["x-fencing-token"] == "7"
    assert fields["traceparent"].startswith("00-")
    assert fields["content-type"] == "application/json; charset=utf-8"
    assert int(fields["content-length"]) == len(body)
    assert body == '{"sessionId":"s","ttlMillis":5000,"ref":"é"}'.encode()
    assert delete.startswith(b"DELETE /v1/locks/k?sessionId=a+b%26c HTTP/1.1\r\n")
    assert b"\r\nContent-Length: 0\r\n" in delete


def test_chunked_and_close_delimited_bodies_and_interim_answers_are_read_whole(peer):
    chunked = (
        b"HTTP/1.1 100 Continue\r\n\r\n"
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-A: 1\r\nx-a: 2\r\n\r\n"
        b'4;ext=1\r\n{"a"\r\n3\r\n:1}\r\n0\r\nTrailer: t\r\n\r\n'
    )
    server = peer(lambda n, _: chunked if n == 1 else Close(b'HTTP/1.0 200 OK\r\n\r\n{"b":2}'))
    first = exchange("GET", f"{server.url}/one", hop=FAST)
    assert first.status == 200 and first.body == {"a": 1}
    assert first.headers["X-A"] == "1, 2"
    second = exchange("GET", f"{server.url}/two", hop=FAST)
    assert second.body == {"b": 2}
    assert server.connections == 1  # the chunked answer left the connection reusable
    exchange("GET", f"{server.url}/three", hop=FAST)
    assert server.connections == 2  # the close-delimited one did not


def test_connection_close_is_never_reused_and_bytes_after_a_body_never_answer_the_next_call(peer):
    """A response the peer sends beyond the one asked for (here a whole forged answer glued to
    the body) must never be read as the answer to the next request on that connection."""
    smuggled = b'HTTP/1.1 200 OK\r\nContent-Length: 14\r\n\r\n{"smuggled":1}'
    answers = {1: _json(200, b"{}", "Connection: close"), 2: _json(200, b"{}") + smuggled}
    server = peer(lambda n, _: answers.get(n, _json(200, b'{"n":%d}' % n)))
    assert exchange("GET", f"{server.url}/x", hop=FAST).body == {}
    assert exchange("GET", f"{server.url}/x", hop=FAST).body == {}
    assert server.connections == 2  # the first answer said close: a new connection
    assert exchange("GET", f"{server.url}/x", hop=FAST).body == {"n": 3}
    assert len(server.requests) == 3


def test_an_idle_connection_the_server_closed_is_replaced_not_reported_as_sent(peer):
    """A keep-alive connection the server closed while idle must not turn the next call into a
    `sent=True` failure (for a rail submission that would be a false RAIL_AMBIGUOUS)."""
    server = peer(lambda n, _: Close(_json(200, b'{"n":%d}' % n)))  # keep-alive, then closes
    assert exchange("GET", f"{server.url}/x", hop=FAST).body == {"n": 1}
    time.sleep(0.1)  # the peer's FIN has arrived; the connection sits idle in the pool
    assert exchange("POST", f"{server.url}/y", hop=FAST, json_body={}).body == {"n": 2}
    assert server.connections == 2 and len(server.requests) == 2


def test_a_connection_idle_longer_than_the_server_keepalive_is_not_reused(peer, monkeypatch):
    monkeypatch.setattr("dlock.http.MAX_IDLE_S", 0.05)
    server = peer(lambda n, _: _json(200, b"{}"))
    exchange("GET", f"{server.url}/x", hop=FAST)
    time.sleep(0.1)
    exchange("GET", f"{server.url}/y", hop=FAST)
    assert server.connections == 2


@pytest.mark.parametrize(
    "reply",
    [
        None,  # the request arrived; the peer closed without a word
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n{}",  # then closed mid-body
        b"NOT HTTP\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2x\r\n\r\n{}",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
    ],
)
def test_anything_after_the_request_left_is_sent_and_not_retry_safe(peer, reply):
    def answer(n: int, request: bytes) -> bytes | None:
        return reply

    server = peer(answer)
    with pytest.raises(ServiceUnreachable) as caught:
        call("POST", f"{server.url}/v1/rail/submissions", hop=FAST, json_body={"a": 1})
    assert len(server.requests) == 1
    assert caught.value.sent is True and caught.value.retry_safe is False


def test_a_silent_peer_times_out_as_sent_within_the_read_budget(peer):
    released, gave_up = threading.Event(), threading.Event()

    def silent(n: int, request: bytes) -> None:
        if not released.wait(10):  # silent until the test is over, or 10 s
            gave_up.set()

    server = peer(silent)
    started = time.monotonic()
    try:
        with pytest.raises(ServiceUnreachable) as caught:
            call("POST", f"{server.url}/v1/x", hop=FAST, json_body={}, read_timeout_s=0.3)
        # It gave up on its own budget while the peer still held its answer back (a client
        # without a read timeout would only fail when the peer closes, after 10 s).
        assert time.monotonic() - started >= 0.3 and not gave_up.is_set()
    finally:
        released.set()
    assert caught.value.sent is True


def test_a_peer_that_trickles_its_answer_cannot_stretch_the_read_budget(peer):
    """The read budget bounds the whole response, not each read: one byte every 50 ms keeps a
    per-read timeout of 0.3 s satisfied for as long as the peer likes (here: 5 s, then it
    closes, which a client with only per-read timeouts would be waiting for)."""
    released, gave_up = threading.Event(), threading.Event()
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"

    def trickle(conn: socket.socket) -> None:
        with conn:
            conn.recv(65536)
            conn.sendall(head)
            for _ in range(100):
                if released.wait(0.05):
                    return
                try:
                    conn.sendall(b" ")
                except OSError:
                    return
            gave_up.set()

    server = peer(lambda n, _: None)
    server.serve = trickle  # this peer answers by hand
    started = time.monotonic()
    try:
        with pytest.raises(ServiceUnreachable) as caught:
            call("GET", f"{server.url}/v1/x", hop=FAST, read_timeout_s=0.3)
        assert time.monotonic() - started >= 0.3 and not gave_up.is_set()
    finally:
        released.set()
    assert caught.value.sent is True


def test_a_peer_that_trickles_its_response_head_cannot_stretch_the_read_budget(peer):
    """The deadline bounds the head too: a status line and headers dribbled a byte at a time
    (each read returns within any per-read timeout) still end the call on its own budget."""
    released, gave_up = threading.Event(), threading.Event()
    head = b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 200 + b"\r\nContent-Length: 2\r\n\r\n{}"

    def trickle(conn: socket.socket) -> None:
        with conn:
            conn.recv(65536)
            for byte in head:
                if released.wait(0.05):
                    return
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    return
            gave_up.set()

    server = peer(lambda n, _: None)
    server.serve = trickle
    try:
        with pytest.raises(ServiceUnreachable) as caught:
            call("POST", f"{server.url}/v1/rail/submissions", hop=FAST, json_body={},
                 read_timeout_s=0.3)  # fmt: skip
        assert not gave_up.is_set()  # ended before the peer finished its head
    finally:
        released.set()
    assert caught.value.sent is True


def test_a_header_value_that_would_split_the_request_is_never_written(peer):
    server = peer(lambda n, _: _json(200, b"{}"))
    with pytest.raises(ServiceUnreachable) as caught:
        call("GET", f"{server.url}/x", hop=FAST, headers={"X-Owner-Id": "a\r\nX-Evil: 1"})
    assert caught.value.sent is False
    time.sleep(0.05)
    assert server.requests == [] and server.connections == 0


def test_an_oversized_answer_is_a_transport_failure_not_a_memory_blowup(peer, monkeypatch):
    monkeypatch.setattr("dlock.http.MAX_BODY_BYTES", 1024)
    server = peer(lambda n, _: _json(200, b"[" + b"1," * 1000 + b"1]"))
    with pytest.raises(ServiceUnreachable) as caught:
        call("GET", f"{server.url}/x", hop=FAST)
    assert caught.value.sent is True


def test_error_envelopes_keep_their_code_and_a_non_json_error_is_internal(peer):
    envelope = (
        b'{"code":"LOCK_CONTENDED","message":"held","retrySafe":true,'
        b'"retryAfterMillis":250,"traceId":"t1","details":{"key":"k"}}'
    )
    answers = {1: _json(409, envelope), 2: b"HTTP/1.1 500 Bad\r\nContent-Length: 5\r\n\r\n<h1/>"}
    server = peer(lambda n, _: answers[n])
    with pytest.raises(LockContended) as contended:
        call("POST", f"{server.url}/v1/locks/k/acquire", hop=FAST, json_body={})
    error = contended.value
    assert (error.status, error.retry_safe, error.retry_after_ms) == (409, True, 250)
    assert error.details == {"key": "k"} and error.trace_id == "t1"
    with pytest.raises(InternalError) as internal:
        call("GET", f"{server.url}/v1/x", hop=FAST)
    assert internal.value.status == 500 and internal.value.retry_safe is False


def _envelope(code: str, retry_safe: bool) -> bytes:
    return json.dumps(
        {"code": code, "message": "m", "retrySafe": retry_safe, "traceId": "t"}
    ).encode()


@pytest.mark.parametrize(
    ("status", "body", "unknown"),
    [
        (504, _envelope("UPSTREAM_TIMEOUT", False), True),  # the proxy forwarded, then gave up
        (502, _envelope("INTERNAL", False), True),  # the upstream failed after the request
        (502, b"<html>bad gateway</html>", True),  # a proxy that is not ours
        (503, _envelope("OVERLOADED", True), False),  # the proxy could not connect: unsent
    ],
)
def test_the_proxys_own_answers_say_whether_the_request_went_in(peer, status, body, unknown):
    server = peer(lambda n, _: _json(status, body))
    with pytest.raises(DlockError) as caught:
        call("POST", f"{server.url}/v1/rail/submissions", hop=FAST, json_body={})
    error = caught.value
    assert error.status == status
    if unknown:  # sent, outcome unknown: never failed over, never re-sent
        assert isinstance(error, ServiceUnreachable) and error.sent is True
        assert error.retry_safe is False and not changed_nothing(error)
    else:
        assert isinstance(error, Overloaded) and changed_nothing(error)
    assert len(server.requests) == 1


def test_json_the_fast_parser_refuses_is_read_as_the_standard_library_reads_it(peer):
    server = peer(lambda n, _: _json(200, b'{"big":123456789012345678901234567890,"x":NaN}'))
    body = exchange("GET", f"{server.url}/x", hop=FAST).body
    assert body["big"] == 123456789012345678901234567890 and body["x"] != body["x"]


def test_json_nested_past_the_parsers_depth_is_an_unreadable_body_not_a_crash(peer):
    # orjson refuses nesting past 1024 levels and the standard library recurses until it
    # raises RecursionError: a hostile peer's answer must read as an unreadable body.
    deep = b"[" * 200_000 + b"]" * 200_000
    answers = {1: _json(200, deep), 2: _json(409, deep)}
    server = peer(lambda n, _: answers[n])
    assert exchange("GET", f"{server.url}/x", hop=FAST).body is None
    with pytest.raises(InternalError) as internal:
        call("POST", f"{server.url}/v1/locks/k/acquire", hop=FAST, json_body={})
    assert internal.value.status == 409 and internal.value.retry_safe is False


def test_a_pool_keeps_as_many_connections_as_threads_in_flight(peer):
    gate = threading.Barrier(8)

    def answer(n: int, request: bytes) -> bytes:
        if n <= 8:
            gate.wait(5)  # all 8 first requests are in flight at once
        return _json(200, b"{}")

    server = peer(answer)
    endpoints = Endpoints(server.url, pool_size=8)

    def one() -> None:
        endpoints.call("GET", "/x", hop=FAST)

    for _ in range(3):
        threads = [threading.Thread(target=one) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert len(server.requests) == 24
    assert server.connections == 8  # rounds 2 and 3 reused round 1's connections
    assert endpoints.pools[0].idle() == 8


def test_a_full_pool_closes_what_it_cannot_keep(peer):
    gate = threading.Barrier(2)

    def answer(n: int, request: bytes) -> bytes:
        if n <= 2:
            gate.wait(5)  # both first requests are in flight at once: two connections
        return _json(200, b"{}")

    server = peer(answer)
    pool = ConnectionPool("http", "127.0.0.1", server.port, size=1)
    threads = [
        threading.Thread(
            target=exchange, args=("GET", f"{server.url}/x"), kwargs={"hop": FAST, "pool": pool}
        )
        for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert server.connections == 2 and pool.idle() == 1  # the second one was closed
    exchange("GET", f"{server.url}/y", hop=FAST, pool=pool)
    assert server.connections == 2  # the kept one was reused


def test_a_post_on_a_kept_alive_connection_that_drops_after_reading_it_is_sent_and_not_resent(
    peer,
):
    """The server reads the second request on the kept-alive connection and closes without a
    word (a crash, a keep-alive race). The request may have been acted on: `sent=True`, and the
    library must not re-send it on a fresh connection (urllib3 would, with its default retries)."""
    server = peer(lambda n, _: _json(200, b"{}") if n == 1 else None)
    assert exchange("POST", f"{server.url}/v1/x", hop=FAST, json_body={}).ok
    with pytest.raises(ServiceUnreachable) as caught:
        call("POST", f"{server.url}/v1/rail/submissions", hop=FAST, json_body={"a": 1})
    assert caught.value.sent is True and caught.value.retry_safe is False
    # The call is over: had the library retried, the peer would hold a third request now.
    assert len(server.requests) == 2 and server.connections == 1


def test_a_redirect_is_an_answer_not_a_second_request(peer):
    moved = b"HTTP/1.1 307 Moved\r\nLocation: /elsewhere\r\nContent-Length: 0\r\n\r\n"
    server = peer(lambda n, _: moved if n == 1 else _json(200, b"{}"))
    with pytest.raises(InternalError) as caught:
        call("POST", f"{server.url}/v1/rail/submissions", hop=FAST, json_body={})
    assert caught.value.status == 307
    assert len(server.requests) == 1


def test_a_refused_connection_is_not_sent():
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(ServiceUnreachable) as caught:
        call("POST", f"{url}/v1/rail/submissions", hop=FAST, json_body={})
    assert caught.value.sent is False and caught.value.retry_safe is True


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory):
    """A throwaway CA and a certificate for 127.0.0.1 it signed (openssl, as `make up TLS=1`)."""
    d = tmp_path_factory.mktemp("tls")
    ext = d / "ext.cnf"
    ext.write_text(
        "[ca]\nbasicConstraints=critical,CA:TRUE\nkeyUsage=critical,keyCertSign,cRLSign\n"
        "subjectKeyIdentifier=hash\n"
        "[srv]\nsubjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n"
        "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
        "authorityKeyIdentifier=keyid\n"
    )
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run = functools.partial(subprocess.run, check=True, capture_output=True, cwd=d)
    run(["openssl", "req", "-new", *ec, "-keyout", "ca.key", "-out", "ca.csr", "-subj", "/CN=t-ca"])
    run(["openssl", "x509", "-req", "-in", "ca.csr", "-signkey", "ca.key", "-out", "ca.pem",
         "-days", "2", "-extfile", "ext.cnf", "-extensions", "ca"])  # fmt: skip
    run(["openssl", "req", "-new", *ec, "-keyout", "srv.key", "-out", "srv.csr", "-subj", "/CN=t"])
    run(["openssl", "x509", "-req", "-in", "srv.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
         "-CAcreateserial", "-out", "srv.pem", "-days", "2", "-extfile", "ext.cnf",
         "-extensions", "srv"])  # fmt: skip
    return d


def _tls_peer(peer, tls_files):
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tls_files / "srv.pem", tls_files / "srv.key")
    server = peer(lambda n, _: _json(200, b'{"tls":true}'))

    def serve(conn: socket.socket) -> None:
        try:
            wrapped = context.wrap_socket(conn, server_side=True)
        except (OSError, ssl.SSLError):
            conn.close()  # the client refused our certificate
            return
        server._serve(wrapped)

    server.serve = serve
    return server


def test_https_is_verified_against_dlock_ca_bundle(peer, tls_files, monkeypatch):
    server = _tls_peer(peer, tls_files)
    url = f"https://127.0.0.1:{server.port}"
    monkeypatch.setenv("DLOCK_CA_BUNDLE", str(tls_files / "ca.pem"))
    pool = ConnectionPool("https", "127.0.0.1", server.port)
    assert exchange("POST", f"{url}/v1/x", hop=FAST, json_body={}, pool=pool).body == {"tls": True}
    assert len(server.requests) == 1


def test_https_without_the_bundle_refuses_an_unknown_ca_before_sending(
    peer, tls_files, monkeypatch
):
    server = _tls_peer(peer, tls_files)
    monkeypatch.delenv("DLOCK_CA_BUNDLE", raising=False)
    pool = ConnectionPool("https", "127.0.0.1", server.port)  # the system store
    with pytest.raises(ServiceUnreachable) as caught:
        call("POST", f"https://127.0.0.1:{server.port}/v1/x", hop=FAST, json_body={}, pool=pool)
    assert caught.value.sent is False  # the handshake failed: no request byte left
    assert server.requests == []


def test_no_client_turns_tls_verification_off():
    root = pathlib.Path(__file__).resolve().parents[2]
    for package in ("dlock", "executor", "railproxy", "ops", "payments", "lockserver"):
        for path in (root / package).rglob("*.py"):
            text = path.read_text()
            assert "verify=False" not in text and "CERT_NONE" not in text, path


def test_a_forked_child_never_reuses_the_parents_connections(peer):
    server = peer(lambda n, _: _json(200, b"{}"))
    endpoints = Endpoints(server.url, pool_size=2)
    endpoints.call("GET", "/x", hop=FAST)
    assert endpoints.pools[0].idle() == 1
    pid = os.fork()
    if pid == 0:  # the child: its pool starts empty, and a call opens its own connection
        ok = endpoints.pools[0].idle() == 0 and endpoints.call("GET", "/y", hop=FAST).ok
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert endpoints.pools[0].idle() == 1  # the parent's connection is still its own
    endpoints.call("GET", "/z", hop=FAST)
    assert server.connections == 2
