"""Admission reads the replay record or the payout (row-locked) in one statement and advances the
high-water mark in one upsert; a refusal still leaves the mark where it was (issue 18)."""

from __future__ import annotations


def test_a_fenced_claim_behind_a_higher_mark_is_refused_by_the_mark_and_moves_nothing(rail):
    stale = rail.claimed_payout(token=90)
    rail.reclaim(stale, 92)
    newer = rail.claimed_payout(token=95, account_id=stale.account_id)
    assert rail.submit(newer).status_code == 200

    response = rail.submit(stale, token=90)

    # Step 1 answers first, as before: the mark (95), not the payout's newer claim (92).
    assert response.status_code == 409, response.text
    details = response.json()["details"]
    assert details["highestToken"] == 95 and details["resourceId"] == stale.account_id
    assert rail.submissions(stale.payout_id) == [("FENCED", 90, "fenced_high_water", None)]
    assert rail.high_water(stale.account_id)[0] == 95
    assert rail.stub_requests(stale.payout_id) == []
    assert rail.payout_state(stale.payout_id) == "CLAIMED"


def test_a_replay_is_answered_from_its_row_and_reads_no_rail(rail):
    payout = rail.claimed_payout(token=97)
    first = rail.submit(payout)
    assert first.status_code == 200

    again = rail.submit(payout)

    assert again.status_code == 200 and again.content == first.content
    # The record was written with the outcome in one statement: it is the answer as sent.
    [(stored,)] = rail.pay(
        "SELECT response_body FROM rail_submission WHERE payout_id = %s", [payout.payout_id]
    )
    assert stored == first.text
    assert again.headers["Idempotent-Replayed"] == "true"
    assert len(rail.stub_requests(payout.payout_id)) == 1
    assert [s[0] for s in rail.submissions(payout.payout_id)] == ["ACKED"]
