"""The rail proxy in front of the real stub: admission order, outcomes, replay, bad inputs."""

from __future__ import annotations

import uuid

import pytest
import requests

from tests.payments.factories import fence_proof

pytestmark = pytest.mark.live


def test_claimed_payout_is_acked_booked_once_and_moves_to_rail_acked(rail):
    payout = rail.claimed_payout(token=101)

    response = rail.submit(payout)

    assert response.status_code == 200, response.text
    body = response.json()
    assert body["payoutId"] == payout.payout_id and body["presentedToken"] == 101
    assert body["outcome"] == "ACKED" and body["railReference"].startswith("RR-")
    assert body["submittedAt"].endswith("Z") and body["resolvedAt"].endswith("Z")
    assert set(body) == {
        "submissionId",
        "payoutId",
        "presentedToken",
        "outcome",
        "railReference",
        "submittedAt",
        "resolvedAt",
    }
    assert rail.transfers(payout.payout_id) == [(body["railReference"], None)]
    assert rail.submissions(payout.payout_id) == [("ACKED", 101, "acked", body["railReference"])]
    assert rail.payout_state(payout.payout_id) == "RAIL_ACKED"
    assert [e[:2] for e in rail.payout_events(payout.payout_id)] == [
        ("CLAIMED", "SUBMITTING"),
        ("SUBMITTING", "RAIL_ACKED"),
    ]
    assert rail.high_water(payout.account_id) == (101, None)


def test_stale_token_is_fenced_out_recorded_and_never_reaches_the_stub(rail):
    first = rail.claimed_payout(token=500)
    assert rail.submit(first).status_code == 200
    stale = rail.claimed_payout(token=400, account_id=first.account_id)

    response = rail.submit(stale, owner="sleepy-worker")

    assert response.status_code == 409
    error = response.json()
    assert error["code"] == "FENCED_OUT" and error["retrySafe"] is False
    assert error["details"] == {
        "presentedToken": 400,
        "highestToken": 500,
        "resourceType": "rail",
        "resourceId": first.account_id,
        "ownerId": "sleepy-worker",
    }
    assert rail.stub_requests(stale.payout_id) == []
    assert rail.transfers(stale.payout_id) == []
    assert rail.submissions(stale.payout_id) == [("FENCED", 400, "fenced_high_water", None)]
    assert rail.payout_state(stale.payout_id) == "CLAIMED"
    assert rail.high_water(first.account_id) == (500, None)


def test_fenced_attempt_counts_in_metrics(rail):
    def series(text: str, name: str) -> float:
        line = next(line for line in text.splitlines() if line.startswith(name))
        return float(line.rsplit(" ", 1)[1])

    before = requests.get(f"{rail.proxy_url}/metrics", timeout=5).text
    first = rail.claimed_payout(token=30)
    rail.submit(first)
    stale = rail.claimed_payout(token=29, account_id=first.account_id)
    assert rail.submit(stale).status_code == 409
    after = requests.get(f"{rail.proxy_url}/metrics", timeout=5).text
    for name in (
        'lock_fenced_out_total{resource="rail"}',
        'rail_submission_total{outcome="fenced"}',
    ):
        assert series(after, name) == series(before, name) + 1
    assert series(after, 'rail_submission_total{outcome="acked"}') >= 1


def test_equal_token_on_another_payout_of_the_account_is_fenced(rail):
    first = rail.claimed_payout(token=77)
    assert rail.submit(first).status_code == 200
    twin = rail.claimed_payout(token=77, account_id=first.account_id)

    response = rail.submit(twin)

    assert response.status_code == 409 and response.json()["code"] == "FENCED_OUT"
    assert response.json()["details"]["highestToken"] == 77
    assert rail.stub_requests(twin.payout_id) == []


def test_second_submission_of_an_acked_payout_with_a_newer_token_is_a_duplicate(rail):
    payout = rail.claimed_payout(token=10)
    assert rail.submit(payout).status_code == 200

    response = rail.submit(payout, token=11, key=payout.key)

    assert response.status_code == 409
    error = response.json()
    assert error["code"] == "DUPLICATE_SUBMISSION" and error["retrySafe"] is False
    assert error["details"]["existingOutcome"] == "ACKED"
    assert len(rail.stub_requests(payout.payout_id)) == 1
    assert len(rail.transfers(payout.payout_id)) == 1
    assert [s[0] for s in rail.submissions(payout.payout_id)] == ["ACKED"]
    # Rolled back with the refusal: the high-water mark did not move to 11.
    assert rail.high_water(payout.account_id) == (10, None)


def test_timeout_is_ambiguous_and_no_later_submission_under_any_token_reaches_the_rail(rail):
    rail.stub_config(latency_ms=3_000)  # longer than the proxy's 1.5 s read timeout
    payout = rail.claimed_payout(token=200)

    response = rail.submit(payout)

    assert response.status_code == 409
    error = response.json()
    assert error["code"] == "RAIL_AMBIGUOUS" and error["retrySafe"] is False
    assert error["details"]["outcome"] == "TIMEOUT"
    assert error["details"]["reason"] == "read_timeout"
    assert rail.payout_state(payout.payout_id) == "RAIL_AMBIGUOUS"
    assert rail.submissions(payout.payout_id)[0][:3] == ("TIMEOUT", 200, "read_timeout")

    rail.stub_config()
    rail.reclaim(payout, 300)  # even a payout row claimed again must not be re-presented
    newer = rail.submit(payout, token=300)
    equal = rail.submit(
        payout, token=200, owner="another-worker", key=payout.key, body=payout.body()
    )
    other_key_equal = rail.submit(payout, token=200, key="payout-retry-" + payout.payout_id)

    assert newer.status_code == 409 and newer.json()["code"] == "DUPLICATE_SUBMISSION"
    # The identical request replays the recorded outcome; nothing new is presented.
    assert equal.status_code == 409 and equal.json()["code"] == "RAIL_AMBIGUOUS"
    assert equal.headers.get("Idempotent-Replayed") == "true"
    # The recorded answer byte for byte, its traceId included (log correlation to the attempt).
    assert equal.content == response.content
    assert other_key_equal.status_code == 400  # not the payout's stable key
    # The slow rail finishes the one request it got after the proxy gave up: money moved once.
    rail.wait_for(lambda: rail.stub_requests(payout.payout_id) == ["ok"])
    assert len(rail.transfers(payout.payout_id)) == 1
    assert [s[0] for s in rail.submissions(payout.payout_id)] == ["TIMEOUT"]


def test_equal_token_after_an_ambiguous_outcome_is_fenced_strictly(rail):
    rail.stub_config(failure_rate=1.0, split_5xx=1, split_drop_before=0, split_drop_after=0)
    first = rail.claimed_payout(token=900)
    assert rail.submit(first).json()["code"] == "RAIL_AMBIGUOUS"
    rail.stub_config()
    same_token_other_payout = rail.claimed_payout(token=900, account_id=first.account_id)

    response = rail.submit(same_token_other_payout)

    assert response.status_code == 409 and response.json()["code"] == "FENCED_OUT"
    assert rail.stub_requests(same_token_other_payout.payout_id) == []
    assert rail.submissions(first.payout_id)[0][:3] == ("TIMEOUT", 900, "http_500")


def test_drop_after_booking_is_ambiguous_and_the_statement_shows_the_transfer(rail):
    rail.stub_config(failure_rate=1.0, split_5xx=0, split_drop_before=0, split_drop_after=1)
    payout = rail.claimed_payout(token=41)

    response = rail.submit(payout)

    assert response.status_code == 409 and response.json()["code"] == "RAIL_AMBIGUOUS"
    assert response.json()["details"]["reason"] == "connection_lost"
    assert rail.payout_state(payout.payout_id) == "RAIL_AMBIGUOUS"
    assert len(rail.transfers(payout.payout_id)) == 1  # money moved; the proxy never learned
    assert rail.stub_requests(payout.payout_id) == ["drop_after_booking"]


def test_drop_before_booking_is_ambiguous_too_and_nothing_is_booked(rail):
    rail.stub_config(
        failure_rate=1.0, split_5xx=0, split_drop_before=1, split_drop_after=0, hold_ms=100
    )
    payout = rail.claimed_payout(token=42)

    response = rail.submit(payout)

    assert response.status_code == 409 and response.json()["code"] == "RAIL_AMBIGUOUS"
    assert rail.transfers(payout.payout_id) == []
    assert rail.payout_state(payout.payout_id) == "RAIL_AMBIGUOUS"


def test_declined_payout_fails_with_422_and_is_never_resubmitted(rail):
    rail.stub_config(decline_rate=1.0)
    payout = rail.claimed_payout(token=61)

    response = rail.submit(payout)

    assert response.status_code == 422
    error = response.json()
    assert error["code"] == "VALIDATION_FAILED" and error["retrySafe"] is False
    assert error["details"]["outcome"] == "DECLINED"
    assert rail.payout_state(payout.payout_id) == "FAILED"
    assert rail.transfers(payout.payout_id) == []
    assert rail.submissions(payout.payout_id)[0][:3] == ("DECLINED", 61, "http_402")
    rail.stub_config()
    assert rail.submit(payout, token=62).json()["code"] == "DUPLICATE_SUBMISSION"


def test_malformed_ack_is_ambiguous(rail_stack, rail):
    """The stub never sends one, so point a second proxy at something that answers 200 non-JSON."""
    from tests.rail.helpers import start_proxy, stub_answering_garbage

    with stub_answering_garbage() as garbage_url:
        proxy = start_proxy(rail_stack, RAIL_STUB_URL=garbage_url)
        try:
            payout = rail.claimed_payout(token=5)
            response = rail.submit(payout, url=proxy.url)
        finally:
            proxy.stop()
    assert response.status_code == 409 and response.json()["code"] == "RAIL_AMBIGUOUS"
    assert response.json()["details"]["reason"] == "malformed_ack"
    assert rail.payout_state(payout.payout_id) == "RAIL_AMBIGUOUS"


def test_identical_request_replays_the_recorded_ack_without_a_second_rail_call(rail):
    payout = rail.claimed_payout(token=15)
    first = rail.submit(payout)

    again = rail.submit(payout)

    assert again.status_code == 200 and again.content == first.content  # byte for byte
    assert again.headers["Idempotent-Replayed"] == "true"
    assert "Idempotent-Replayed" not in first.headers
    assert len(rail.stub_requests(payout.payout_id)) == 1
    assert len(rail.transfers(payout.payout_id)) == 1


def test_same_key_and_token_with_a_different_body_is_an_idempotency_conflict(rail):
    payout = rail.claimed_payout(token=16)
    assert rail.submit(payout).status_code == 200

    response = rail.submit(payout, body=payout.body(beneficiaryRef="someone-else"))

    assert response.status_code == 422 and response.json()["code"] == "IDEMPOTENCY_CONFLICT"
    assert len(rail.stub_requests(payout.payout_id)) == 1


def test_payout_claimed_by_a_newer_holder_fences_the_old_holder(rail):
    payout = rail.claimed_payout(token=70)
    rail.reclaim(payout, 71)

    response = rail.submit(payout, token=70)

    assert response.status_code == 409
    assert response.json()["code"] == "FENCED_OUT"
    assert response.json()["details"]["highestToken"] == 71
    assert response.json()["details"]["resourceId"] == payout.payout_id
    assert rail.submissions(payout.payout_id) == [("FENCED", 70, "fenced_claim", None)]
    assert rail.stub_requests(payout.payout_id) == []
    # The refused attempt did not advance the mark: the newer holder is admitted.
    assert rail.high_water(payout.account_id) is None or rail.high_water(payout.account_id)[0] < 70
    assert rail.submit(payout, token=71).status_code == 200


def test_token_newer_than_the_claim_is_not_claimable_and_leaves_no_trace(rail):
    payout = rail.claimed_payout(token=80)

    response = rail.submit(payout, token=81)

    assert response.status_code == 409
    assert response.json()["code"] == "PAYOUT_NOT_CLAIMABLE"
    assert response.json()["details"]["claimToken"] == 80
    assert rail.submissions(payout.payout_id) == []
    assert rail.high_water(payout.account_id) in (None, (0, None))
    assert rail.submit(payout, token=80).status_code == 200


def test_pending_payout_is_not_claimable(rail):
    payout = rail.claimed_payout(token=90)
    rail.pay("UPDATE payout SET state = 'PENDING' WHERE payout_id = %s", [payout.payout_id])

    response = rail.submit(payout)

    assert response.status_code == 409
    assert response.json()["details"]["state"] == "PENDING"
    assert rail.submissions(payout.payout_id) == []


def test_unknown_payout_is_not_found_and_writes_nothing(rail):
    payout = rail.claimed_payout(token=3)
    ghost = payout.body(payoutId=str(uuid.uuid4()))

    response = rail.submit(payout, body=ghost, key=f"payout-{ghost['payoutId']}")

    assert response.status_code == 404 and response.json()["code"] == "NOT_FOUND"
    assert rail.submissions(ghost["payoutId"]) == []


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ({"amountMinor": 1}, "amountMinor"),
        ({"accountId": "acct-someone-else"}, "accountId"),
        ({"currency": "USD"}, "currency"),
        ({"beneficiaryRef": "elsewhere"}, "beneficiaryRef"),
    ],
)
def test_body_that_does_not_match_the_payout_is_rejected_without_a_row(rail, override, field):
    payout = rail.claimed_payout(token=7)

    response = rail.submit(payout, body=payout.body(**override))

    assert response.status_code == 400 and response.json()["code"] == "VALIDATION_FAILED"
    assert [f["field"] for f in response.json()["details"]["fields"]] == [field]
    assert rail.submissions(payout.payout_id) == []
    assert rail.payout_state(payout.payout_id) == "CLAIMED"


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ({"amountMinor": 0}, "amountMinor"),
        ({"amountMinor": -5}, "amountMinor"),
        ({"amountMinor": "1250"}, "amountMinor"),
        ({"amountMinor": 2**63}, "amountMinor"),
        ({"currency": "eur"}, "currency"),
        ({"currency": "EURO"}, "currency"),
        ({"payoutId": "not-a-uuid"}, "payoutId"),
        ({"payoutId": 12}, "payoutId"),
        ({"extra": 1}, "extra"),
    ],
)
def test_bad_body_is_validation_failed_and_writes_nothing(rail, override, field):
    payout = rail.claimed_payout(token=8)

    response = rail.submit(payout, body=payout.body(**override))

    assert response.status_code == 400 and response.json()["code"] == "VALIDATION_FAILED"
    assert field in [f["field"] for f in response.json()["details"]["fields"]]
    assert rail.submissions(payout.payout_id) == []
    assert rail.high_water(payout.account_id) is None


@pytest.mark.parametrize(
    ("headers", "code"),
    [
        ({"X-Fencing-Token": None}, "INVALID_TOKEN"),
        ({"X-Fencing-Token": "0"}, "INVALID_TOKEN"),
        ({"X-Fencing-Token": "-3"}, "INVALID_TOKEN"),
        ({"X-Fencing-Token": "abc"}, "INVALID_TOKEN"),
        ({"X-Fencing-Token": str(2**63)}, "INVALID_TOKEN"),
        ({"X-Owner-Id": None}, "VALIDATION_FAILED"),
        ({"X-Idempotency-Key": None}, "VALIDATION_FAILED"),
    ],
)
def test_missing_or_bad_headers_are_rejected_before_any_row(rail, headers, code):
    payout = rail.claimed_payout(token=9)

    response = rail.submit(payout, headers=headers)

    assert response.status_code == 400 and response.json()["code"] == code
    assert rail.submissions(payout.payout_id) == []
    assert rail.high_water(payout.account_id) is None


def test_outgoing_call_carries_the_trace_id(rail, rail_stack):
    payout = rail.claimed_payout(token=12)
    trace = uuid.uuid4().hex
    response = rail.submit(payout, headers={"traceparent": f"00-{trace}-{'1' * 16}-01"})
    assert response.status_code == 200
    stub_log = (rail_stack.logdir / "railstub.log").read_text()
    line = next(line for line in stub_log.splitlines() if payout.payout_id in line)
    assert trace in line


def test_real_claim_then_submit_then_post_runs_the_whole_payout(rail_stack, rail):
    """P2 claim (payments) → rail submission (proxy) → P3 post; P4 shows the submission."""
    payout = rail.claimed_payout(token=1)
    rail.pay(
        "UPDATE payout SET state = 'PENDING', claim_token = NULL, attempt_count = 0"
        " WHERE payout_id = %s",
        [payout.payout_id],
    )
    rail.pay("UPDATE account SET fence = 0 WHERE account_id = %s", [payout.account_id])
    payments = rail_stack.url("payments")
    headers = {
        "X-Fencing-Token": "33",
        "X-Fencing-Proof": fence_proof(payout.account_id, 33),
        "X-Owner-Id": "worker-a",
        "X-Idempotency-Key": payout.key,
    }

    claim = requests.post(
        f"{payments}/v1/payouts/{payout.payout_id}/claim",
        json={"expectedState": "PENDING"},
        headers=headers,
        timeout=10,
    )
    assert claim.status_code == 200, claim.text
    submitted = rail.submit(payout, token=33)
    assert submitted.status_code == 200, submitted.text
    post = requests.post(
        f"{payments}/v1/payouts/{payout.payout_id}/post",
        json={
            "railReference": submitted.json()["railReference"],
            "submissionId": submitted.json()["submissionId"],
            "railOutcome": "ACKED",
        },
        headers=headers,
        timeout=10,
    )

    assert post.status_code == 200, post.text
    assert rail.payout_state(payout.payout_id) == "POSTED"
    detail = requests.get(f"{payments}/v1/payouts/{payout.payout_id}", timeout=10).json()
    assert [s["outcome"] for s in detail["submissions"]] == ["ACKED"]
    assert len(rail.transfers(payout.payout_id)) == 1
