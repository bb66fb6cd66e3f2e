"""The payment resource under gunicorn on loopback (shared live stack: fresh ids every test)."""

from __future__ import annotations

import json
import re
import uuid

import pytest
import requests

from tests.payments.factories import fence_proof

pytestmark = pytest.mark.live

TIMEOUT = 5


def _seed(live_stack, *, balance=10_000, amount=1_000, payouts=2) -> dict:
    done = live_stack.manage(
        "seed_payouts",
        "--accounts=1",
        f"--payouts-per-account={payouts}",
        f"--balance-minor={balance}",
        f"--amount-minor={amount}",
        "--json",
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def _fenced_total(base: str, resource: str = "account") -> float:
    text = requests.get(f"{base}/metrics", timeout=TIMEOUT).text
    match = re.search(rf'^lock_fenced_out_total\{{resource="{resource}"\}} (\S+)$', text, re.M)
    assert match, "lock_fenced_out_total must be exposed with a zero series per resource"
    return float(match.group(1))


def _claim(base, payout_id, token, owner="w1", expected="PENDING", *, account):
    return requests.post(
        f"{base}/v1/payouts/{payout_id}/claim",
        json={"expectedState": expected},
        headers={
            "X-Fencing-Token": str(token),
            "X-Fencing-Proof": fence_proof(account, token),
            "X-Owner-Id": owner,
            "X-Idempotency-Key": f"payout-{payout_id}",
        },
        timeout=TIMEOUT,
    )


def test_claim_fenced_out_and_replay_over_real_http(live_stack):
    base = live_stack.url("payments")
    seeded = _seed(live_stack)
    first, second = seeded["payouts"]
    # Tokens far above anything another test on this shared stack would present.
    newer = 9_000_000_000 + uuid.uuid4().int % 1_000_000_000
    before = _fenced_total(base)

    acct = seeded["accounts"][0]
    won = _claim(base, first, newer, account=acct)
    replay = _claim(base, first, newer, account=acct)
    fenced = _claim(base, second, newer - 5, owner="paused-worker", account=acct)

    assert won.status_code == 200 and won.json()["accountFence"] == newer
    assert replay.status_code == 200 and replay.headers["Idempotent-Replayed"] == "true"
    assert replay.content == won.content
    assert fenced.status_code == 409
    assert fenced.headers["Content-Type"] == "application/json; charset=utf-8"
    assert fenced.json()["details"] == {
        "presentedToken": newer - 5,
        "highestToken": newer,
        "resourceType": "account",
        "resourceId": seeded["accounts"][0],
        "ownerId": "paused-worker",
    }
    assert _fenced_total(base) - before == 1


def test_metrics_carry_no_payout_or_account_ids(live_stack):
    base = live_stack.url("payments")
    seeded = _seed(live_stack, payouts=1)
    _claim(
        base, seeded["payouts"][0], 1, account=seeded["accounts"][0]
    )  # whatever the answer, ids must not become labels
    text = requests.get(f"{base}/metrics", timeout=TIMEOUT).text
    assert seeded["payouts"][0] not in text and seeded["accounts"][0] not in text
    assert re.search(r"payout_id|account_id", text) is None


def test_invalid_token_over_http_is_400_before_any_work(live_stack):
    base = live_stack.url("payments")
    response = requests.post(
        f"{base}/v1/payouts/{uuid.uuid4()}/claim",
        data='{"expectedState":"PENDING"}',
        headers={
            "Content-Type": "application/json",
            "X-Fencing-Token": "abc",
            "X-Owner-Id": "w1",
            "X-Idempotency-Key": "k1",
        },
        timeout=TIMEOUT,
    )
    assert response.status_code == 400 and response.json()["code"] == "INVALID_TOKEN"


def test_account_read_over_http_after_seeding(live_stack):
    base = live_stack.url("payments")
    seeded = _seed(live_stack, balance=4_200, payouts=0)
    body = requests.get(f"{base}/v1/accounts/{seeded['accounts'][0]}", timeout=TIMEOUT).json()
    assert body["balanceMinor"] == body["ledgerSumMinor"] == 4_200


def test_the_admin_is_served_by_the_admin_role_behind_a_staff_login_and_not_by_payments(
    live_stack, admin_url
):
    response = requests.get(
        f"{admin_url}/admin/payments/quarantinedpayout/", timeout=TIMEOUT, allow_redirects=False
    )
    assert response.status_code == 302 and "/admin/login/" in response.headers["Location"]
    login = requests.get(f"{admin_url}/admin/login/", timeout=TIMEOUT)
    assert login.status_code == 200 and "text/html" in login.headers["Content-Type"]
    # payment-resource serves C3 only: the admin's paths are a 404 envelope there
    for path in ("/admin/", "/admin/login/", "/static/admin/css/base.css"):
        refused = requests.get(f"{live_stack.url('payments')}{path}", timeout=TIMEOUT)
        assert refused.status_code == 404, path
        assert refused.json()["code"] == "NOT_FOUND", path


@pytest.mark.parametrize("forged", [None, "v2.t1." + "A" * 86])
def test_a_forged_max_token_over_http_moves_no_fence_and_the_honest_holder_still_claims(
    live_stack, forged
):
    base = live_stack.url("payments")
    seeded = _seed(live_stack, payouts=2)
    acct, (victim, later) = seeded["accounts"][0], seeded["payouts"]
    headers = {
        "X-Fencing-Token": str(2**63 - 1),
        "X-Owner-Id": "attacker",
        "X-Idempotency-Key": f"payout-{victim}",
    }
    if forged is not None:
        headers["X-Fencing-Proof"] = forged

    attack = requests.post(
        f"{base}/v1/payouts/{victim}/claim",
        json={"expectedState": "PENDING"},
        headers=headers,
        timeout=TIMEOUT,
    )

    assert attack.status_code == 400 and attack.json()["code"] == "INVALID_TOKEN"
    assert attack.json()["details"]["reason"] == ("missing" if forged is None else "mismatch")
    account = requests.get(f"{base}/v1/accounts/{acct}", timeout=TIMEOUT).json()
    assert account["fence"] == 0
    assert account["balanceMinor"] == account["ledgerSumMinor"] == 10_000
    payout = requests.get(f"{base}/v1/payouts/{victim}", timeout=TIMEOUT).json()
    assert payout["state"] == "PENDING"
    assert _claim(base, later, 5, account=acct).status_code == 200
