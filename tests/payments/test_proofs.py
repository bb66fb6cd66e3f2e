"""P2/P3 demand X-Fencing-Proof for `payout:{accountId}` of the payout they touch (issue 15
item 2): a forged, unbound or foreign token is 400 INVALID_TOKEN and writes nothing."""

from __future__ import annotations

import os
import uuid

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from devstack.envfile import public_keys_of
from dlock import proof
from dlock.fence.proofs import new_signing_key
from payments import selectors
from payments.models import Account
from tests.payments import factories as f

pytestmark = pytest.mark.django_db(databases=["default"])

FORGED_MAX = 2**63 - 1


def _invalid(response) -> str:
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["code"] == "INVALID_TOKEN" and body["retrySafe"] is False
    assert body["details"]["field"] == "X-Fencing-Proof"
    return body["details"]["reason"]


def _books_balanced(acct) -> None:
    answer = selectors.get_account(account_id=acct.account_id)
    assert answer["balanceMinor"] == answer["ledgerSumMinor"]


@pytest.mark.parametrize(
    "forged, reason",
    [(None, "missing"), ("v2.t1." + "A" * 86, "mismatch"), ("not-a-proof", "malformed")],
)
def test_a_forged_max_token_cannot_brick_the_account(client, forged, reason):
    acct = f.account(10_000)
    victim, later = f.payout(acct), f.payout(acct)
    before = f.snapshot(victim)

    assert _invalid(f.claim(client, victim, FORGED_MAX, fproof=forged)) == reason
    f.rail_acked(victim)
    assert _invalid(f.post(client, victim, FORGED_MAX, fproof=forged)) == reason

    assert Account.objects.get(account_id=acct.account_id).fence == before["fence"] == 0
    assert {**f.snapshot(victim), "state": "PENDING"} == before
    # The honest holder is not fenced out afterwards.
    assert f.claim(client, later, f.next_token()).status_code == 200
    _books_balanced(acct)


def test_a_genuine_proof_from_an_unrelated_lock_claims_nothing(client):
    acct = f.account()
    p = f.payout(acct)
    before = f.snapshot(p)
    token = f.next_token()
    unrelated = proof.sign(key="unrelated:anything", token=token)

    assert _invalid(f.claim(client, p, token, fproof=unrelated)) == "mismatch"

    assert f.snapshot(p) == before
    _books_balanced(acct)


def test_a_proof_for_another_accounts_payout_lock_claims_nothing(client):
    mine, theirs = f.account(), f.account()
    p = f.payout(theirs)
    before = f.snapshot(p)
    token = f.next_token()

    response = f.claim(client, p, token, fproof=f.fence_proof(mine.account_id, token))

    assert _invalid(response) == "mismatch"
    assert f.snapshot(p) == before


def test_a_proof_for_another_token_of_the_right_key_claims_nothing(client):
    acct = f.account()
    p = f.payout(acct)
    before = f.snapshot(p)
    token = f.next_token()

    response = f.claim(client, p, token + 1, fproof=f.fence_proof(acct.account_id, token))

    assert _invalid(response) == "mismatch"
    assert f.snapshot(p) == before


def test_a_proof_signed_with_an_unknown_kid_claims_nothing(client):
    acct = f.account()
    p = f.payout(acct)
    before = f.snapshot(p)
    token = f.next_token()
    with override_settings(DLOCK_PROOF_KEYS=proof.parse_key_ring(new_signing_key("elsewhere"))):
        foreign = f.fence_proof(acct.account_id, token)

    assert _invalid(f.claim(client, p, token, fproof=foreign)) == "unknown_kid"
    assert f.snapshot(p) == before


def test_a_missing_proof_costs_no_database_work(client, django_assert_num_queries):
    p = f.payout(f.account())
    with django_assert_num_queries(0):
        assert _invalid(f.claim(client, p, f.next_token(), fproof=None)) == "missing"


def test_the_proof_of_an_unknown_payout_is_not_found_not_a_verdict(client):
    acct = f.account()
    p = f.payout(acct)
    p.payout_id = uuid.uuid4()  # never stored
    response = f.claim(client, p, f.next_token())
    assert response.status_code == 404 and response.json()["code"] == "NOT_FOUND"


def test_after_rotation_old_proofs_verify_while_the_old_kid_is_in_the_ring(client):
    acct = f.account()
    first, second = f.payout(acct), f.payout(acct)
    old_token = f.next_token()
    old_proof = f.fence_proof(acct.account_id, old_token)  # signed by t1, before the rotation
    t9 = new_signing_key("t9")
    ring = f"{t9},{os.environ['DLOCK_PROOF_KEYS']}"
    with override_settings(DLOCK_PROOF_KEYS=proof.parse_key_ring(ring)):
        assert f.claim(client, first, old_token, fproof=old_proof).status_code == 200
        new_token = f.next_token()
        new_proof = f.fence_proof(acct.account_id, new_token)
        assert new_proof.startswith("v2.t9.")
        assert f.claim(client, second, new_token, fproof=new_proof).status_code == 200
    with override_settings(DLOCK_PROOF_KEYS=proof.parse_key_ring(t9)):
        f.rail_acked(first)
        assert _invalid(f.post(client, first, old_token, fproof=old_proof)) == "unknown_kid"
    _books_balanced(acct)


def test_a_verifier_holding_only_public_keys_claims_with_the_lock_servers_proof(client):
    """payment-resource as deployed: DLOCK_FENCING_PUBLIC_KEYS, no private key in the process."""
    acct = f.account()
    p = f.payout(acct)
    token = f.next_token()
    signed = proof.sign(
        key=proof.payout_key(acct.account_id),
        token=token,
        ring=proof.parse_key_ring(os.environ["DLOCK_PROOF_KEYS"]),
    )
    public = proof.parse_public_keys(public_keys_of(os.environ["DLOCK_PROOF_KEYS"]))
    with override_settings(
        DLOCK_PROOF_KEYS=proof.parse_key_ring(""), DLOCK_FENCING_PUBLIC_KEYS=public
    ):
        with pytest.raises(ImproperlyConfigured):
            proof.sign(key=proof.payout_key(acct.account_id), token=token)  # nothing to sign with
        assert f.claim(client, p, token, fproof=signed).status_code == 200


def test_truncated_other_key_and_lower_token_proofs_claim_nothing_and_the_books_stay(client):
    acct = f.account(10_000)
    p = f.payout(acct)
    before = f.snapshot(p)
    token = f.next_token()
    key = proof.payout_key(acct.account_id)
    genuine = proof.sign(key=key, token=token)
    impostor = proof.parse_key_ring(new_signing_key("t1")).sign(key=key, token=token)
    cases = [
        (genuine[:-1], "malformed"),
        (genuine[:50], "malformed"),
        (impostor, "mismatch"),  # the server's kid, another private key
        (proof.sign(key=key, token=token - 1), "mismatch"),  # a lower token's genuine proof
    ]
    for forged, reason in cases:
        assert _invalid(f.claim(client, p, token, fproof=forged)) == reason
        assert f.snapshot(p) == before
    _books_balanced(acct)
    assert f.claim(client, p, token, fproof=genuine).status_code == 200
