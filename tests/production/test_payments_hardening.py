"""Hostile inputs against the payment resource itself (issue 15 item 4): a forged P1 cursor and
a truncated claim body change nothing and answer 400, never 500 or 200."""

from __future__ import annotations

import base64
import json
import socket
import uuid
from urllib.parse import urlsplit

import pytest
import requests

from dlock import proof
from tests import credentials
from tests.payments.test_live import _seed

pytestmark = pytest.mark.live


def _cursor(created_at: str) -> str:
    raw = json.dumps([1, created_at, str(uuid.uuid4()), "", ""], separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


@pytest.mark.parametrize(
    "created_at",
    ["2026-01-01T00:00:00+23:59", "2026-01-01T00:00:00-23:59", "2026-01-01T00:00:00+05:00"],
)
def test_a_forged_cursor_offset_is_400_validation_failed(live_stack, created_at):
    answer = requests.get(
        f"{live_stack.url('payments')}/v1/payouts",
        params={"cursor": _cursor(created_at)},
        timeout=5,
    )
    assert answer.status_code == 400
    body = answer.json()
    assert body["code"] == "VALIDATION_FAILED" and body["details"]["fields"][0]["field"] == "cursor"


def test_an_issued_cursor_still_pages(live_stack):
    base = live_stack.url("payments")
    seeded = _seed(live_stack, payouts=3)
    account = seeded["accounts"][0]
    first = requests.get(f"{base}/v1/payouts", params={"accountId": account, "limit": 2}, timeout=5)
    assert first.status_code == 200 and first.json()["nextCursor"]
    rest = requests.get(
        f"{base}/v1/payouts",
        params={"accountId": account, "limit": 2, "cursor": first.json()["nextCursor"]},
        timeout=5,
    )
    assert rest.status_code == 200 and len(rest.json()["items"]) == 1


def test_a_truncated_claim_body_is_never_forwarded_and_the_payout_stays_pending(live_stack):
    """The client half-closes 73 bytes short of its Content-Length: the proxy, which buffers
    every body whole before forwarding, drops the request (nginx answers a client that stopped
    sending with nothing, its 499) or refuses it with the 400 envelope; never a claim."""
    base = live_stack.url("payments")
    seeded = _seed(live_stack, payouts=1)
    payout = seeded["payouts"][0]
    # A genuine proof: the truncated body must be the only thing wrong with the request.
    fproof = proof.sign(key=proof.payout_key(seeded["accounts"][0]), token=5)
    body = b'{"expectedState":"PENDING"}'
    assert len(body) == 27
    port = urlsplit(base).port
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(
            f"POST /v1/payouts/{payout}/claim HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {credentials.EXECUTOR}\r\n"
            "Content-Type: application/json\r\nContent-Length: 100\r\nX-Fencing-Token: 5\r\n"
            f"X-Fencing-Proof: {fproof}\r\n"
            f"X-Owner-Id: truncator\r\nX-Idempotency-Key: payout-{payout}\r\n\r\n".encode()
            + body
        )
        sock.shutdown(socket.SHUT_WR)
        chunks = []
        while data := sock.recv(65536):
            chunks.append(data)
    answer = b"".join(chunks)
    assert answer == b"" or (
        answer.startswith(b"HTTP/1.1 400") and b'"code":"VALIDATION_FAILED"' in answer
    ), answer[:300]
    after = requests.get(f"{base}/v1/payouts/{payout}", timeout=5).json()
    assert after["state"] == "PENDING"
