"""Rail submissions demand X-Fencing-Proof for `payout:{accountId}` of the payout as paydb stores
it (issue 15 item 2): otherwise 400 INVALID_TOKEN, no high-water move, no intent, no rail call."""

from __future__ import annotations

import pytest

from dlock import proof
from dlock.fence.proofs import SigningKeys, new_signing_key

FORGED_MAX = 2**63 - 1


def _refused(rail, payout, response, reason: str) -> None:
    assert response.status_code == 400, response.text
    body = response.json()
    assert body["code"] == "INVALID_TOKEN"
    assert body["details"] == {"field": "X-Fencing-Proof", "reason": reason}
    assert rail.submissions(payout.payout_id) == []
    assert rail.high_water(payout.account_id) is None
    assert rail.stub_requests(payout.payout_id) == []
    assert rail.payout_state(payout.payout_id) == "CLAIMED"


@pytest.mark.parametrize(
    "forged, reason",
    [(None, "missing"), ("v2.t1." + "B" * 86, "mismatch"), ("v1.t1.B", "malformed")],
)
def test_a_forged_max_token_cannot_raise_the_rail_high_water_mark(rail, forged, reason):
    payout = rail.claimed_payout(token=5)

    response = rail.submit(payout, token=FORGED_MAX, headers={"X-Fencing-Proof": forged})

    _refused(rail, payout, response, reason)
    # The honest holder still reaches the rail afterwards.
    assert rail.submit(payout).status_code == 200


def test_a_genuine_proof_from_an_unrelated_lock_reaches_no_rail(rail):
    payout = rail.claimed_payout(token=6)
    unrelated = proof.sign(key="unrelated:anything", token=6)

    response = rail.submit(payout, headers={"X-Fencing-Proof": unrelated})

    _refused(rail, payout, response, "mismatch")


def test_the_proof_is_checked_against_the_stored_account_not_the_bodys(rail):
    """A holder of `payout:mine` naming its own account in the body still opens nothing."""
    payout = rail.claimed_payout(token=7)
    mine = "acct-attacker"
    response = rail.submit(
        payout,
        body=payout.body(accountId=mine),
        headers={"X-Fencing-Proof": proof.sign(key=proof.payout_key(mine), token=7)},
    )
    _refused(rail, payout, response, "mismatch")


def test_a_proof_for_another_token_reaches_no_rail(rail):
    payout = rail.claimed_payout(token=8)
    other = proof.sign(key=proof.payout_key(payout.account_id), token=7)
    _refused(rail, payout, rail.submit(payout, headers={"X-Fencing-Proof": other}), "mismatch")


def test_a_proof_with_an_unknown_kid_reaches_no_rail(rail):
    payout = rail.claimed_payout(token=9)
    unknown = "v2.retired." + "C" * 86
    response = rail.submit(payout, headers={"X-Fencing-Proof": unknown})
    _refused(rail, payout, response, "unknown_kid")


def _impostor_proof(payout, token: int) -> str:
    """The right shape, the server's kid, another private key: what a forger can make."""
    impostor = SigningKeys.parse(new_signing_key("t1"))
    return impostor.sign(key=proof.payout_key(payout.account_id), token=token)


def test_truncated_other_key_and_lower_token_proofs_reach_no_rail(rail):
    payout = rail.claimed_payout(token=7)
    genuine = proof.sign(key=proof.payout_key(payout.account_id), token=7)
    cases = [
        (genuine[:-1], "malformed"),
        (genuine[:50], "malformed"),
        (_impostor_proof(payout, 7), "mismatch"),
        (proof.sign(key=proof.payout_key(payout.account_id), token=6), "mismatch"),
    ]
    for forged, reason in cases:
        _refused(rail, payout, rail.submit(payout, headers={"X-Fencing-Proof": forged}), reason)
    assert rail.submit(payout).status_code == 200  # the genuine proof still admits
