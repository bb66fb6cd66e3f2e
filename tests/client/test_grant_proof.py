"""The client library carries the lock server's fencingProof on `Grant` and sends it beside the
token wherever it sends the token (L5, L6); a caller passes `grant.fence_headers()` to the
payment resource and the rail proxy (the executor does)."""

from __future__ import annotations

import json
import uuid

import pytest
import requests

from dlock import proof
from dlock.client import LockClient

pytestmark = pytest.mark.live


def test_the_grant_carries_a_proof_for_its_key_and_token_and_renew_and_release_send_it(
    live_stack,
):
    client = LockClient(live_stack.url("lockserver"), "client-proof")
    key = f"test:client:proof:{uuid.uuid4().hex[:8]}"
    with client.session(10_000) as session, session.lock(key, 5_000) as grant:
        proof.verify(grant.proof, key=key, token=grant.token)
        assert grant.fence_headers() == {
            "X-Fencing-Token": str(grant.token),
            "X-Fencing-Proof": grant.proof,
        }
        grant.renew()  # refused with INVALID_TOKEN if the proof were not sent
        assert grant.release() is True  # likewise: False on any refusal
    assert client.info(key)["held"] is False


def test_a_grant_of_the_accounts_lock_claims_its_payout_and_another_lock_does_not(live_stack):
    seeded = json.loads(
        live_stack.manage(
            "seed_payouts",
            "--accounts=1",
            "--payouts-per-account=1",
            "--balance-minor=10000",
            "--amount-minor=100",
            "--json",
        )
        .stdout.strip()
        .splitlines()[-1]
    )
    account, payout_id = seeded["accounts"][0], seeded["payouts"][0]
    client = LockClient(live_stack.url("lockserver"), "client-proof-claim")
    url = f"{live_stack.url('payments')}/v1/payouts/{payout_id}/claim"
    common = {"X-Owner-Id": "client-proof-claim", "X-Idempotency-Key": f"payout-{payout_id}"}
    with client.session(10_000) as session:
        with session.lock("unrelated:anything", 5_000) as other:
            refused = requests.post(
                url,
                json={"expectedState": "PENDING"},
                headers={**common, **other.fence_headers()},
                timeout=10,
            )
        with session.lock(f"payout:{account}", 5_000) as grant:
            claimed = requests.post(
                url,
                json={"expectedState": "PENDING"},
                headers={**common, **grant.fence_headers()},
                timeout=10,
            )
    assert refused.status_code == 400 and refused.json()["code"] == "INVALID_TOKEN"
    assert refused.json()["details"]["reason"] == "mismatch"
    assert claimed.status_code == 200, claimed.text
    assert claimed.json()["claimToken"] == grant.token
    books = requests.get(f"{live_stack.url('payments')}/v1/accounts/{account}", timeout=10).json()
    assert books["balanceMinor"] == books["ledgerSumMinor"] == 10_000
    assert books["fence"] == grant.token
