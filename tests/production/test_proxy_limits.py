"""What a stranger sends stops at payment-resource's nginx (issue 38 items 3 and 4): bodies
bounded per route, a trickled body ended, one address capped apart from the others, Host checked
in every spelling, the proxy's own paths and gunicorn's refusals answered as envelopes, and not
one ERROR line in the role's log for any of it.

The attacker connects from 127.0.0.2, the honest client from 127.0.0.1 (both loopback): the
per-address cap (`PROXY_CONN_PER_CLIENT`) keys on the address, so the attacker fills its own.
"""

from __future__ import annotations

import json
import select
import socket
import threading
import uuid

import pytest
import requests

from devstack.common import free_port
from devstack.roles import RoleProcess
from dlock import proof
from tests.production.conftest import migrated_paydb, seed_payouts
from tests.production.test_hostile_connections import (
    Target,
    claim_head,
    ending,
    statuses,
)

pytestmark = [pytest.mark.live, pytest.mark.slow]

ATTACKER = "127.0.0.2"
SLOW_BODIES = 1024
TRICKLE_GAP_S = 2.0  # 0.5 B/s


@pytest.fixture(scope="module")
def payments(tmp_path_factory):
    db_url, env = migrated_paydb("limits")
    ids = seed_payouts(env, payouts=2)
    logdir = tmp_path_factory.mktemp("limits")
    proc = RoleProcess("payments", free_port(), env, logdir / "payments.log").start()
    target = Target(proc, db_url, ids["accounts"][0], ids["payouts"][0])
    target.honest_payout_id = ids["payouts"][1]  # claimed by the honest executor below
    yield target
    proc.stop()


def _fenced_headers(payout_id: str, token: int, account_id: str) -> dict[str, str]:
    return {
        "X-Fencing-Token": str(token),
        "X-Fencing-Proof": proof.sign(key=proof.payout_key(account_id), token=token),
        "X-Owner-Id": "honest-executor",
        "X-Idempotency-Key": f"payout-{payout_id}",
    }


def claim(url: str, payout_id: str, token: int, account_id: str) -> requests.Response:
    return requests.post(
        f"{url}/v1/payouts/{payout_id}/claim",
        json={"expectedState": "PENDING"},
        headers=_fenced_headers(payout_id, token, account_id),
        timeout=30,
    )


def post(url: str, payout_id: str, token: int, account_id: str) -> requests.Response:
    body = {"railReference": "r-1", "submissionId": str(uuid.uuid4()), "railOutcome": "ACKED"}
    return requests.post(
        f"{url}/v1/payouts/{payout_id}/post",
        json=body,
        headers=_fenced_headers(payout_id, token, account_id),
        timeout=30,
    )


def attacker_socket(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=30, source_address=(ATTACKER, 0))
    sock.setblocking(True)
    return sock


def answered(sock: socket.socket) -> bool:
    """The server said something or closed `sock` (poll: more sockets than select takes)."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))


def exchange(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(request)
        return ending(sock, 30)


def envelope_of(answer: bytes) -> tuple[int, dict[str, str], dict]:
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return statuses(head)[0], headers, json.loads(body)


def assert_envelope(answer: bytes, status: int, code: str) -> dict:
    got, headers, body = envelope_of(answer)
    assert got == status, answer
    assert headers["content-type"] == "application/json; charset=utf-8"
    assert headers["x-content-type-options"] == "nosniff"
    assert headers["x-frame-options"] == "DENY"
    assert "default-src 'none'" in headers["content-security-policy"]
    assert {"code", "message", "retrySafe", "traceId"} <= set(body)
    assert body["code"] == code and len(body["traceId"]) == 32
    return body


# ---------------------------------------------------------------------------- item 3: bodies


def test_a_claim_body_over_one_kib_is_413_at_the_proxy_and_a_post_body_under_its_limit_is_not(
    payments,
):
    books = payments.books()
    url = f"{payments.proc.url}/v1/payouts/{payments.payout_id}"
    big_claim = requests.post(
        f"{url}/claim",
        data=b'{"expectedState": "PENDING", "pad": "' + b"x" * 1100 + b'"}',
        headers={"Content-Type": "application/json"},
        timeout=30,
    )
    assert big_claim.status_code == 413, big_claim.text
    assert big_claim.json()["code"] == "VALIDATION_FAILED"
    assert big_claim.headers["X-Content-Type-Options"] == "nosniff"
    # P3's railReference may be 128 characters of JSON escapes: 2 KiB is within its route's
    # limit, so the role answers it (401: no credential), not the proxy.
    post = requests.post(
        f"{url}/post",
        data=b'{"railReference": "' + b"\\u00e9" * 128 + b'", "pad": "' + b" " * 900 + b'"}',
        headers={"Content-Type": "application/json"},
        timeout=30,
    )
    assert post.status_code != 413 and post.json()["code"] != "VALIDATION_FAILED", post.text
    assert payments.books() == books


def test_1024_slow_bodies_from_one_address_leave_another_served_and_a_trickle_is_ended(payments):
    """1 024 claims from 127.0.0.2 whose bodies trickle at 0.5 B/s: beyond the per-address cap
    they are refused at once (503 envelope), within it they are held by nginx alone. While held,
    the honest client on 127.0.0.1 is served (never a 503). Every trickle is then ended by the
    proxy (closed, never forwarded) although each byte arrives within the header timeout: this
    test runs about as long as the proxy lets a trickle live (bounded below a minute)."""
    books, log = payments.books(), payments.log_size()
    held: list[socket.socket] = []
    stop = threading.Event()

    def trickle() -> None:
        while not stop.wait(TRICKLE_GAP_S):
            for sock in list(held):
                try:
                    sock.send(b" ")
                except OSError:
                    pass  # closed by the proxy: what this test waits for

    refused = 0
    dripper = threading.Thread(target=trickle, daemon=True)
    try:
        for _ in range(SLOW_BODIES):
            sock = attacker_socket(payments.port)
            sock.sendall(claim_head(payments, length=600) + b"{")
            held.append(sock)
        dripper.start()
        # the honest executor's claim and post (P2, P3) are answered by the role, never 503
        honest = payments.honest_payout_id
        claimed = claim(payments.proc.url, honest, 11, payments.account_id)
        assert claimed.status_code == 200 and claimed.json()["state"] == "CLAIMED", claimed.text
        posted = post(payments.proc.url, honest, 11, payments.account_id)
        assert posted.status_code == 409, posted.text  # answered: the rail never acked it
        assert posted.json()["code"] == "PAYOUT_NOT_CLAIMABLE"
        for _ in range(3):
            payments.served()
            answer = requests.get(
                f"{payments.proc.url}/v1/payouts?state=PENDING",
                headers={"Connection": "close"},
                timeout=30,
            )
            assert answer.status_code != 503, answer.text
        still = [sock for sock in held if not answered(sock)]
        assert still, "the proxy ended every slow body before the honest calls were made"
        answers = []
        for sock in held:
            answer = ending(sock, 70)
            answers.append(answer)
            if statuses(answer) == [503]:
                refused += 1
                assert_envelope(answer, 503, "OVERLOADED")
            else:
                assert answer == b"", answer  # closed by client_body_timeout, never forwarded
    finally:
        stop.set()
        for sock in held:
            sock.close()
    assert 0 < refused < SLOW_BODIES  # the cap refused some, and held the others
    # the attacker's payout untouched; the account's fence is the honest claim's, not 999
    assert payments.books()[:2] == books[:2]
    assert payments.books()[2] == [(books[2][0][0], 11)]
    assert payments.errors_since(log) == []


# ------------------------------------------------------------------ item 4: envelopes, quiet logs

FOREIGN_HOSTS = {
    "absolute-form request line, foreign Host": (
        b"GET http://127.0.0.1:{port}/v1/payouts HTTP/1.1\r\nHost: evil.example\r\n"
    ),
    "userinfo-like Host": b"GET /v1/payouts HTTP/1.1\r\nHost: 127.0.0.1:{port}@evil.example\r\n",
    "absolute-form to a foreign host": (
        b"GET http://evil.example/v1/payouts HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
    ),
    "foreign Host": b"GET /v1/payouts HTTP/1.1\r\nHost: evil.example\r\n",
    "allowed name as a prefix": b"GET /v1/payouts HTTP/1.1\r\nHost: localhost.evil.example\r\n",
    "port that is no port": b"GET /v1/payouts HTTP/1.1\r\nHost: 127.0.0.1:80x\r\n",
    "trailing junk": b"GET /v1/payouts HTTP/1.1\r\nHost: 127.0.0.1:{port}/x\r\n",
    "a health path under a foreign Host": (
        b"GET http://127.0.0.1:{port}/health/ready HTTP/1.1\r\nHost: evil.example:1\r\n"
    ),
}


@pytest.mark.parametrize("head", list(FOREIGN_HOSTS.values()), ids=list(FOREIGN_HOSTS))
def test_every_spelling_of_a_foreign_host_is_a_400_envelope_and_never_reaches_django(
    payments, head
):
    log = payments.log_size()
    request = head.replace(b"{port}", str(payments.port).encode()) + b"Connection: close\r\n\r\n"
    answer = exchange(payments.port, request)
    body = assert_envelope(answer, 400, "VALIDATION_FAILED")
    # nginx refuses a Host it cannot parse itself (`/` in it): the field is then the request's
    assert body["details"]["fields"][0]["field"] in ("Host", "request")
    payments.served()
    assert payments.errors_since(log) == []


def test_the_allowed_names_with_and_without_a_port_are_served(payments):
    for host in (b"127.0.0.1", b"LOCALHOST:%d" % payments.port, b"127.0.0.1:%d" % payments.port):
        request = b"GET /health/live HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" % host
        assert statuses(exchange(payments.port, request)) == [200], host


@pytest.mark.parametrize("path", [b"/_dlock/x", b"/_dlock/400", b"/_dlock/upstream", b"/_dlock/"])
def test_the_proxy_s_own_paths_asked_for_by_a_client_are_a_404_envelope(payments, path):
    request = b"GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n" % path
    assert_envelope(exchange(payments.port, request), 404, "NOT_FOUND")


@pytest.mark.parametrize("header", [b"traceparent", b"Authorization", b"X-Debug-Note"])
@pytest.mark.parametrize("byte", [b"\x01", b"\x1b", b"\x7f"], ids=["SOH", "ESC", "DEL"])
def test_a_control_byte_in_a_header_value_is_answered_with_an_envelope_never_gunicorn_s_page(
    payments, header, byte
):
    """gunicorn refuses a control byte in any header value with its own HTML page. A header a
    /v1 route reads is refused by nginx first (400 envelope); one no route reads is not
    forwarded at all, so the call is answered as without it (here 401: no credential)."""
    books, log = payments.books(), payments.log_size()
    request = (
        claim_head(payments, length=2).replace(
            b"\r\n\r\n", b"\r\n" + header + b": a" + byte + b"b\r\nConnection: close\r\n\r\n"
        )
        + b"{}"
    )
    answer = exchange(payments.port, request)
    assert b"<html" not in answer.lower(), answer
    if header == b"X-Debug-Note":
        body = assert_envelope(answer, 401, "UNAUTHENTICATED")
    else:
        body = assert_envelope(answer, 400, "VALIDATION_FAILED")
        assert body["details"]["fields"][0]["field"] == "headers"
    assert payments.books() == books
    assert payments.errors_since(log) == []


@pytest.mark.parametrize("path", [b"/health/live", b"/metrics"])
def test_a_control_byte_in_an_unread_header_of_a_probe_never_reaches_gunicorn(payments, path):
    request = (
        b"GET %s HTTP/1.1\r\nHost: 10.1.2.3:8080\r\nX-Debug-Note: a\x01b\r\n"
        b"Connection: close\r\n\r\n" % path
    )
    answer = exchange(payments.port, request)
    assert statuses(answer) == [200], answer[:300]
    assert b"<html" not in answer.lower()
