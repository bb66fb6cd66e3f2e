"""The requests a payout's path sends (C3), as `(role, method, path, body)` for a bench
client's `call(role, method, path, body, headers)`: L4 acquire, P2 claim, the rail submission,
P3 post and L6 release: what the payout floor's clients (bench/payout_floor.py) send, with their
own connections, headers, order and checks."""

from __future__ import annotations

from typing import Any

Request = tuple[str, str, str, dict[str, Any] | None]


def acquire(lock: str, session_id: str) -> Request:
    return "lockserver", "POST", f"/v1/locks/{lock}/acquire", {"sessionId": session_id}


def claim(payout_id: str) -> Request:
    return "payments", "POST", f"/v1/payouts/{payout_id}/claim", {"expectedState": "PENDING"}


def submission(
    payout_id: str, account_id: str, amount: int, currency: str, claimed: dict[str, Any]
) -> Request:
    body = {
        "payoutId": payout_id,
        "accountId": account_id,
        "amountMinor": amount,
        "currency": currency,
        "beneficiaryRef": claimed["beneficiaryRef"],
    }
    return "railproxy", "POST", "/v1/rail/submissions", body


def post(payout_id: str, submitted: dict[str, Any]) -> Request:
    body = {
        "railReference": submitted["railReference"],
        "submissionId": submitted["submissionId"],
        "railOutcome": "ACKED",
    }
    return "payments", "POST", f"/v1/payouts/{payout_id}/post", body


def release(lock: str, session_id: str) -> Request:
    return "lockserver", "DELETE", f"/v1/locks/{lock}?sessionId={session_id}", None
