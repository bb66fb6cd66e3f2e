"""P1–P5 over Django's test client on real PostgreSQL: T-022 §4/§5 cases and the bad inputs."""

from __future__ import annotations

import logging
import uuid

import pytest

from payments import services
from payments.models import Account, IdempotencyRecord, LedgerEntry, Payout, PayoutEvent
from tests.payments import factories as f

pytestmark = pytest.mark.django_db(databases=["default"])

FENCED_DETAILS = {"presentedToken", "highestToken", "resourceType", "resourceId", "ownerId"}


def _fenced_events(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "event", None) == "fenced_out"]


# --- P2 claim ------------------------------------------------------------------------------


def test_claim_with_a_winning_token_answers_claimed_with_the_post_update_fence(client):
    acct = f.account(10_000)
    p = f.payout(acct, 1_000)
    token = f.next_token()

    response = f.claim(client, p, token)

    assert response.status_code == 200
    assert response["Content-Type"] == "application/json; charset=utf-8"
    assert response.json() == {
        "payoutId": str(p.payout_id),
        "state": "CLAIMED",
        "claimToken": token,
        "accountFence": token,
        "attemptCount": 1,
        "idempotencyKey": f"payout-{p.payout_id}",
        "beneficiaryRef": p.beneficiary_ref,  # what the rail submission carries (CHANGELOG 53)
    }
    row = Payout.objects.get(payout_id=p.payout_id)
    assert (row.state, row.claim_token, row.claim_owner_id) == ("CLAIMED", token, "w1")
    assert Account.objects.get(account_id=acct.account_id).fence == token
    last = PayoutEvent.objects.filter(payout_id=p.payout_id).latest("id")
    assert (last.from_state, last.to_state, last.token, last.owner_id) == (
        "PENDING",
        "CLAIMED",
        token,
        "w1",
    )


def test_stale_claim_is_fenced_out_with_all_five_details_and_counted_exactly_once(client, caplog):
    acct = f.account()
    first, second = f.payout(acct), f.payout(acct)
    newer = f.next_token()
    stale = newer - 1
    assert f.claim(client, first, newer).status_code == 200
    before_state = f.snapshot(second)
    before = f.fenced_count("account")
    caplog.set_level(logging.INFO, logger="dlock.events")

    response = f.claim(client, second, stale, owner="sleepy-worker")

    assert response.status_code == 409
    body = response.json()
    assert body["code"] == "FENCED_OUT"
    assert body["retrySafe"] is False
    assert "retryAfterMillis" not in body and "Retry-After" not in response
    assert set(body["details"]) == FENCED_DETAILS
    assert body["details"] == {
        "presentedToken": stale,
        "highestToken": newer,
        "resourceType": "account",
        "resourceId": acct.account_id,
        "ownerId": "sleepy-worker",
    }
    assert f.fenced_count("account") - before == 1
    # The ledger series exists and stays 0: a stale token is fenced at the account, before any
    # ledger row is touched (docs/payments.md "Fencing").
    assert f.fenced_sample("ledger") == 0.0
    events = _fenced_events(caplog)
    assert len(events) == 1
    assert events[0].resource == "account"
    assert events[0].resourceId == acct.account_id
    assert (events[0].presentedToken, events[0].highestToken) == (stale, newer)
    assert events[0].ownerId == "sleepy-worker"
    assert f.snapshot(second) == before_state


def test_the_fenced_counter_reads_zero_before_and_exactly_one_after_the_single_fenced_case(
    client,
):
    acct = f.account()
    p = f.payout(acct)
    baseline = f.fenced_count("account")
    t = f.next_token()
    assert f.claim(client, p, t).status_code == 200
    f.rail_acked(p)
    assert f.post(client, p, t).status_code == 200
    assert f.fenced_count("account") - baseline == 0

    other = f.payout(acct)
    assert f.claim(client, other, t - 1).status_code == 409

    assert f.fenced_count("account") - baseline == 1


@pytest.mark.parametrize(
    "raw",
    ["abc", "0", "-1", None, "", "+5", " 5", "5 ", "000", "1.0", "9223372036854775808", "9" * 20],
)
def test_malformed_tokens_are_invalid_token_without_touching_the_database(
    client, raw, django_assert_num_queries
):
    acct = f.account()
    p = f.payout(acct)
    before = f.snapshot(p)

    with django_assert_num_queries(0):
        response = f.claim(client, p, raw)

    assert response.status_code == 400
    assert response.json()["code"] == "INVALID_TOKEN"
    assert f.snapshot(p) == before


def test_missing_owner_id_on_claim_is_validation_failed_not_invalid_token(client):
    p = f.payout(f.account())
    before = f.snapshot(p)
    response = f.claim(client, p, f.next_token(), owner=None)
    assert response.status_code == 400
    assert response.json()["code"] == "VALIDATION_FAILED"
    assert response.json()["details"]["fields"][0]["field"] == "X-Owner-Id"
    assert f.snapshot(p) == before


@pytest.mark.parametrize(
    ("owner", "key", "field"),
    [
        ("w" * 65, None, "X-Owner-Id"),
        ("w1", "k" * 129, "X-Idempotency-Key"),
        ("w1", "has space", "X-Idempotency-Key"),
        ("w1", "", "X-Idempotency-Key"),
    ],
)
def test_oversized_or_missing_headers_are_validation_failed_and_change_nothing(
    client, owner, key, field
):
    p = f.payout(f.account())
    before = f.snapshot(p)
    h = f.headers(f.next_token(), owner, key if key is not None else p.idempotency_key)
    if key == "":
        h.pop("X-Idempotency-Key")
    response = client.post(
        f"/v1/payouts/{p.payout_id}/claim",
        data={"expectedState": "PENDING"},
        content_type="application/json",
        headers=h,
    )
    assert response.status_code == 400
    assert response.json()["code"] == "VALIDATION_FAILED"
    assert response.json()["details"]["fields"][0]["field"] == field
    assert f.snapshot(p) == before


@pytest.mark.parametrize(
    "body",
    [
        {"expectedState": 5},
        {"expectedState": "POSTED"},
        {"expectedState": "pending"},
        {"expectedState": "PENDING", "extra": 1},
        {},
        [],
        {"expectedState": None},
    ],
)
def test_bad_claim_bodies_are_validation_failed_and_change_nothing(client, body):
    p = f.payout(f.account())
    before = f.snapshot(p)
    response = f.claim(client, p, f.next_token(), body=body)
    assert response.status_code == 400
    assert response.json()["code"] == "VALIDATION_FAILED"
    assert f.snapshot(p) == before


def test_claim_of_a_malformed_payout_id_is_validation_failed(client):
    response = client.post(
        "/v1/payouts/not-a-uuid/claim",
        data={"expectedState": "PENDING"},
        content_type="application/json",
        headers=f.headers(f.next_token(), "w1", "k1"),
    )
    assert response.status_code == 400
    assert response.json()["code"] == "VALIDATION_FAILED"


def test_claim_of_an_unknown_payout_is_not_found(client):
    ghost = Payout(payout_id=uuid.uuid4(), idempotency_key="k-ghost")
    response = f.claim(client, ghost, f.next_token())
    assert response.status_code == 404
    assert response.json()["code"] == "NOT_FOUND"


@pytest.mark.parametrize("state", ["POSTED", "FAILED", "ABANDONED", "RAIL_AMBIGUOUS", "SUBMITTING"])
def test_claim_of_a_payout_outside_pending_is_not_claimable_and_rolls_the_fence_back(client, state):
    p = f.payout(f.account(), state=state)
    before = f.snapshot(p)
    response = f.claim(client, p, f.next_token())
    assert response.status_code == 409
    assert response.json()["code"] == "PAYOUT_NOT_CLAIMABLE"
    assert response.json()["details"]["state"] == state
    assert f.snapshot(p) == before


def test_insufficient_funds_fails_the_payout_commits_and_answers_422(client):
    acct = f.account(500)
    p = f.payout(acct, 1_000)
    token = f.next_token()

    response = f.claim(client, p, token)

    assert response.status_code == 422
    body = response.json()
    assert body["code"] == "INSUFFICIENT_FUNDS"
    assert body["details"]["availableMinor"] == 500
    row = Payout.objects.get(payout_id=p.payout_id)
    assert row.state == "FAILED"
    assert PayoutEvent.objects.filter(payout_id=p.payout_id, to_state="FAILED").count() == 1
    assert Account.objects.get(account_id=acct.account_id).balance_minor == 500
    replay = f.claim(client, p, token)
    assert replay.status_code == 422
    assert replay["Idempotent-Replayed"] == "true"
    assert replay.json() == body


def test_the_funds_check_uses_the_available_balance_net_of_in_flight_payouts(client):
    acct = f.account(1_000)
    first, second = f.payout(acct, 600), f.payout(acct, 600)
    assert f.claim(client, first, f.next_token()).status_code == 200
    f.payout(acct, 1)  # unrelated PENDING payouts reserve nothing
    Payout.objects.filter(payout_id=first.payout_id).update(state="RAIL_AMBIGUOUS")

    response = f.claim(client, second, f.next_token())

    assert response.status_code == 422
    assert response.json()["details"]["availableMinor"] == 400
    assert Account.objects.get(account_id=acct.account_id).balance_minor == 1_000


def test_a_newer_token_re_claims_a_claimed_payout_for_recovery(client):
    acct = f.account()
    p = f.payout(acct)
    old, new = f.next_token(), f.next_token()
    assert f.claim(client, p, old).status_code == 200

    response = f.claim(client, p, new, owner="w2", expected="CLAIMED")

    assert response.status_code == 200
    assert response.json()["attemptCount"] == 2
    assert response.json()["claimToken"] == new
    row = Payout.objects.get(payout_id=p.payout_id)
    assert (row.claim_token, row.claim_owner_id, row.attempt_count) == (new, "w2", 2)


def test_same_key_with_a_newer_token_is_a_new_attempt_judged_by_the_state_machine(client):
    p = f.payout(f.account())
    assert f.claim(client, p, f.next_token()).status_code == 200
    response = f.claim(client, p, f.next_token(), expected="PENDING")
    assert response.status_code == 409
    assert response.json()["code"] == "PAYOUT_NOT_CLAIMABLE"
    assert "Idempotent-Replayed" not in response


def test_claim_replay_returns_the_stored_answer_without_new_events_or_metrics(client, caplog):
    p = f.payout(f.account())
    token = f.next_token()
    first = f.claim(client, p, token)
    before = f.snapshot(p)
    counted = f.fenced_count("account")
    caplog.set_level(logging.INFO, logger="dlock.events")

    replay = f.claim(client, p, token)

    assert replay.status_code == 200
    assert replay["Idempotent-Replayed"] == "true"
    assert replay.json() == first.json()
    assert "Idempotent-Replayed" not in first
    assert f.snapshot(p) == before
    assert f.fenced_count("account") == counted
    assert not _fenced_events(caplog)


def test_same_identity_with_a_different_body_is_idempotency_conflict(client):
    p = f.payout(f.account())
    token = f.next_token()
    assert f.claim(client, p, token).status_code == 200
    before = f.snapshot(p)

    response = f.claim(client, p, token, expected="CLAIMED")

    assert response.status_code == 422
    assert response.json()["code"] == "IDEMPOTENCY_CONFLICT"
    assert f.snapshot(p) == before


def test_claim_hot_path_query_count(client, django_assert_num_queries):
    p = f.payout(f.account())
    # the payout's account for the proof check, then savepoint + (idempotency lock, record or
    # fenced UPDATE, claim check, transition + event + record) + release savepoint
    with django_assert_num_queries(7):
        response = f.claim(client, p, f.next_token())
    assert response.status_code == 200


# --- P3 post ------------------------------------------------------------------------------


def test_post_happy_path_returns_two_balanced_entries_and_the_new_balance(client):
    acct = f.account(10_000)
    p = f.payout(acct, 1_250)
    token = f.next_token()
    assert f.claim(client, p, token).status_code == 200
    f.rail_acked(p)
    submission = uuid.uuid4()

    response = f.post(
        client, p, token, body={"railReference": "RR-1", "submissionId": str(submission)}
    )

    assert response.status_code == 200
    body = response.json()
    assert body["payoutId"] == str(p.payout_id)
    assert body["state"] == "POSTED"
    assert body["balanceMinor"] == 8_750
    legs = {e["direction"]: e for e in body["entries"]}
    assert set(legs) == {"DEBIT", "CREDIT"}
    assert legs["DEBIT"]["amountMinor"] == legs["CREDIT"]["amountMinor"] == 1_250
    assert legs["DEBIT"]["fence"] == legs["CREDIT"]["fence"] == token
    assert 10_000 - legs["DEBIT"]["amountMinor"] == body["balanceMinor"]
    debit = LedgerEntry.objects.get(entry_id=legs["DEBIT"]["entryId"])
    credit = LedgerEntry.objects.get(entry_id=legs["CREDIT"]["entryId"])
    assert debit.account_id == acct.account_id
    assert credit.account_id == "settlement:EUR"
    row = Payout.objects.get(payout_id=p.payout_id)
    assert (row.state, row.rail_reference, row.rail_submission_id) == ("POSTED", "RR-1", submission)
    account = client.get(f"/v1/accounts/{acct.account_id}").json()
    assert account["balanceMinor"] == account["ledgerSumMinor"] == 8_750


def test_post_of_a_payout_not_in_rail_acked_is_not_claimable(client):
    p = f.payout(f.account())
    token = f.next_token()
    assert f.claim(client, p, token).status_code == 200
    before = f.snapshot(p)

    response = f.post(client, p, token)

    assert response.status_code == 409
    assert response.json()["code"] == "PAYOUT_NOT_CLAIMABLE"
    assert response.json()["details"]["state"] == "CLAIMED"
    assert f.snapshot(p) == before


@pytest.mark.parametrize("state", ["POSTED", "FAILED", "ABANDONED", "RAIL_AMBIGUOUS"])
def test_no_token_posts_a_quarantined_or_terminal_payout(client, state):
    p = f.payout(f.account(), state=state)
    before = f.snapshot(p)
    response = f.post(client, p, f.next_token())
    assert response.status_code == 409
    assert response.json()["code"] == "PAYOUT_NOT_CLAIMABLE"
    assert f.snapshot(p) == before


def test_stale_post_after_a_newer_claim_is_fenced_out_with_both_tokens(client):
    acct = f.account()
    p, other = f.payout(acct), f.payout(acct)
    old = f.next_token()
    assert f.claim(client, p, old).status_code == 200
    f.rail_acked(p)
    newer = f.next_token()
    assert f.claim(client, other, newer, owner="w2").status_code == 200
    before = f.snapshot(p)
    counted = f.fenced_count("account")

    response = f.post(client, p, old, owner="w1")

    assert response.status_code == 409
    details = response.json()["details"]
    assert (details["presentedToken"], details["highestToken"]) == (old, newer)
    assert details["resourceType"] == "account" and details["ownerId"] == "w1"
    assert f.fenced_count("account") - counted == 1
    assert f.snapshot(p) == before


def test_a_recovering_holder_with_a_newer_token_may_post_a_rail_acked_payout(client):
    p = f.payout(f.account())
    assert f.claim(client, p, f.next_token()).status_code == 200
    f.rail_acked(p)
    assert f.post(client, p, f.next_token(), owner="w2").status_code == 200


def test_post_replay_answers_the_stored_body_and_posts_nothing_twice(client):
    acct = f.account(5_000)
    p = f.payout(acct, 1_000)
    token = f.next_token()
    f.claim(client, p, token)
    f.rail_acked(p)
    body = {"railReference": "RR-9", "submissionId": str(uuid.uuid4())}
    first = f.post(client, p, token, body=body)
    before = f.snapshot(p)

    replay = f.post(client, p, token, body=body)
    conflict = f.post(client, p, token, body={**body, "railReference": "RR-10"})

    assert replay.status_code == 200 and replay["Idempotent-Replayed"] == "true"
    assert replay.json() == first.json()
    assert conflict.status_code == 422 and conflict.json()["code"] == "IDEMPOTENCY_CONFLICT"
    assert f.snapshot(p) == before
    assert LedgerEntry.objects.filter(payout_id=p.payout_id).count() == 2


@pytest.mark.parametrize(
    "body",
    [
        {"submissionId": "00000000-0000-0000-0000-000000000001"},
        {"railReference": "RR", "submissionId": "nope"},
        {"railReference": 5, "submissionId": "00000000-0000-0000-0000-000000000001"},
        {"railReference": "RR", "submissionId": "00000000-0000-0000-0000-000000000001", "x": 1},
        {
            "railReference": "RR",
            "submissionId": "00000000-0000-0000-0000-000000000001",
            "railOutcome": "TIMEOUT",
        },
        {"railReference": "R" * 129, "submissionId": "00000000-0000-0000-0000-000000000001"},
    ],
)
def test_bad_post_bodies_are_validation_failed_and_post_nothing(client, body):
    p = f.payout(f.account())
    token = f.next_token()
    f.claim(client, p, token)
    f.rail_acked(p)
    before = f.snapshot(p)
    response = f.post(client, p, token, body=body)
    assert response.status_code == 400
    assert response.json()["code"] == "VALIDATION_FAILED"
    assert f.snapshot(p) == before


def test_post_without_a_token_is_invalid_token(client):
    p = f.payout(f.account())
    response = f.post(client, p, None)
    assert response.status_code == 400 and response.json()["code"] == "INVALID_TOKEN"


# --- atomic publication -----------------------------------------------------------------


class Boom(RuntimeError):
    pass


@pytest.fixture
def failing_last_write():
    def hook(operation: str) -> None:
        raise Boom(f"injected failure after the last write of {operation}")

    services.FAULT_HOOK = hook
    yield
    services.FAULT_HOOK = None


def test_a_claim_failing_at_its_last_write_leaves_no_trace(client, failing_last_write):
    p = f.payout(f.account())
    before = f.snapshot(p)
    response = f.claim(client, p, f.next_token())
    assert response.status_code == 500
    assert response.json()["code"] == "INTERNAL"
    assert f.snapshot(p) == before
    assert not IdempotencyRecord.objects.filter(payout_id=p.payout_id).exists()


def test_a_post_failing_at_its_last_write_leaves_no_trace(client):
    acct = f.account()
    p = f.payout(acct)
    token = f.next_token()
    f.claim(client, p, token)
    f.rail_acked(p)
    before = f.snapshot(p)

    def hook(operation):
        raise Boom(operation)

    services.FAULT_HOOK = hook
    try:
        response = f.post(client, p, token)
    finally:
        services.FAULT_HOOK = None

    assert response.status_code == 500
    assert f.snapshot(p) == before
    assert not LedgerEntry.objects.filter(payout_id=p.payout_id).exists()
    assert f.post(client, p, token).status_code == 200  # the same command, now without fault


def test_an_insufficient_funds_claim_failing_at_its_last_write_leaves_no_trace(
    client, failing_last_write
):
    p = f.payout(f.account(10), 1_000)
    before = f.snapshot(p)
    assert f.claim(client, p, f.next_token()).status_code == 500
    assert f.snapshot(p) == before


# --- scopes: the on-call reads with the operator credential ---------------------------------


def test_the_operator_credential_reads_payouts_list_and_detail(client):
    from tests import credentials

    acct = f.account()
    p = f.payout(acct, 1_234)
    operator = {"HTTP_AUTHORIZATION": f"Bearer {credentials.OPERATOR}"}

    listed = client.get(f"/v1/payouts?accountId={acct.account_id}", **operator)
    detail = client.get(f"/v1/payouts/{p.payout_id}", **operator)

    assert listed.status_code == 200, listed.content
    assert [i["payoutId"] for i in listed.json()["items"]] == [str(p.payout_id)]
    assert detail.status_code == 200, detail.content
    assert detail.json()["amountMinor"] == 1_234


def test_the_operator_credential_may_not_claim_or_post_and_nothing_changes(client):
    from tests import credentials

    acct = f.account()
    p = f.payout(acct)
    before = f.snapshot(p)
    operator = {"HTTP_AUTHORIZATION": f"Bearer {credentials.OPERATOR}"}
    headers = {
        "HTTP_X_FENCING_TOKEN": str(f.next_token()),
        "HTTP_X_OWNER_ID": "oncall",
        "HTTP_X_IDEMPOTENCY_KEY": f"payout-{p.payout_id}",
        **operator,
    }

    for path, body in (
        ("claim", {"expectedState": "PENDING"}),
        ("post", {"railReference": "RR-1", "submissionId": str(uuid.uuid4())}),
    ):
        refused = client.post(
            f"/v1/payouts/{p.payout_id}/{path}", body, content_type="application/json", **headers
        )
        assert refused.status_code == 403, refused.content
        assert refused.json()["code"] == "FORBIDDEN"
        assert refused.json()["details"] == {"requiredScope": "executor"}
    assert f.snapshot(p) == before
    account = client.get(f"/v1/accounts/{acct.account_id}", **operator)
    assert account.status_code == 403  # only the payout reads are opened to the on-call


# --- P1 list ------------------------------------------------------------------------------


def test_list_filters_by_state_and_account_and_pages_with_next_cursor(client):
    acct = f.account()
    made = [f.payout(acct, 100 + i) for i in range(5)]
    f.payout(acct, state="FAILED")
    f.payout(f.account())  # another account

    seen: list[str] = []
    url = f"/v1/payouts?state=PENDING&accountId={acct.account_id}&limit=2"
    page = client.get(url).json()
    seen += [i["payoutId"] for i in page["items"]]
    assert len(page["items"]) == 2 and "nextCursor" in page
    inserted = f.payout(acct, 999)  # a concurrent insert sorts after everything already seen
    while "nextCursor" in page:
        page = client.get(url + "&cursor=" + page["nextCursor"]).json()
        seen += [i["payoutId"] for i in page["items"]]

    assert seen == [str(p.payout_id) for p in made] + [str(inserted.payout_id)]
    item = client.get(url).json()["items"][0]
    assert set(item) == {
        "payoutId",
        "accountId",
        "amountMinor",
        "currency",
        "state",
        "attemptCount",
        "createdAt",
    }
    assert item["createdAt"].endswith("Z") and len(item["createdAt"]) == 24


def test_list_default_limit_and_no_cursor_on_the_last_page(client):
    acct = f.account()
    f.payout(acct)
    body = client.get(f"/v1/payouts?accountId={acct.account_id}").json()
    assert len(body["items"]) == 1 and "nextCursor" not in body


@pytest.mark.parametrize(
    "query",
    [
        "state=BOGUS",
        "state=pending",
        "limit=0",
        "limit=501",
        "limit=abc",
        "limit=-1",
        "limit=1.5",
        "cursor=garbage!!",
        "cursor=eyJ4IjoxfQ",
        "cursor=WzEsIm5vdC1hLWRhdGUiLCJ4IiwiIiwiIl0",
        "colour=blue",
        "state=PENDING&state=FAILED",
        "accountId=" + "a" * 65,
    ],
)
def test_bad_list_queries_are_validation_failed(client, query):
    response = client.get(f"/v1/payouts?{query}")
    assert response.status_code == 400
    assert response.json()["code"] == "VALIDATION_FAILED"


def test_a_cursor_is_only_valid_for_the_filters_it_was_issued_for(client):
    acct = f.account()
    f.payout(acct), f.payout(acct)
    cursor = client.get(f"/v1/payouts?accountId={acct.account_id}&limit=1").json()["nextCursor"]
    response = client.get(f"/v1/payouts?state=FAILED&limit=1&cursor={cursor}")
    assert response.status_code == 400 and response.json()["code"] == "VALIDATION_FAILED"


def test_list_needs_no_headers_and_rejects_none(client):
    response = client.get("/v1/payouts?limit=1", headers={"X-Fencing-Token": "garbage"})
    assert response.status_code == 200


# --- P4 / P5 ------------------------------------------------------------------------------


def test_payout_read_returns_the_full_payout_and_its_submissions(client):
    p = f.payout(f.account(), 321)
    body = client.get(f"/v1/payouts/{p.payout_id}").json()
    assert body["payoutId"] == str(p.payout_id)
    assert body["amountMinor"] == 321 and body["state"] == "PENDING"
    assert body["idempotencyKey"] == f"payout-{p.payout_id}"
    assert body["submissions"] == []


def test_payout_read_summarises_the_rail_proxy_submissions(client):
    from railproxy.models import RailSubmission

    p = f.payout(f.account(), 321)
    fenced, acked = uuid.uuid4(), uuid.uuid4()
    for sid, token, outcome, ref in ((fenced, 5, "FENCED", None), (acked, 9, "ACKED", "RR-5")):
        RailSubmission.objects.create(
            submission_id=sid,
            payout_id=p.payout_id,
            account_id=p.account_id,
            amount_minor=321,
            currency="EUR",
            presented_token=token,
            owner_id="w1",
            idempotency_key=p.idempotency_key,
            request_hash="0" * 64,
            client_ref=str(p.payout_id),
            outcome=outcome,
            rail_reference=ref,
        )
    body = client.get(f"/v1/payouts/{p.payout_id}").json()
    subs = body["submissions"]
    assert {
        (s["submissionId"], s["presentedToken"], s["outcome"], s["railReference"]) for s in subs
    } == {
        (str(fenced), 5, "FENCED", None),
        (str(acked), 9, "ACKED", "RR-5"),
    }


def test_payout_read_of_unknown_and_malformed_ids(client):
    assert client.get(f"/v1/payouts/{uuid.uuid4()}").json()["code"] == "NOT_FOUND"
    bad = client.get("/v1/payouts/1234")
    assert bad.status_code == 400 and bad.json()["code"] == "VALIDATION_FAILED"


def test_account_read_recomputes_the_ledger_sum_and_reports_divergence_as_data(client):
    acct = f.account(7_000)
    body = client.get(f"/v1/accounts/{acct.account_id}").json()
    assert body["balanceMinor"] == body["ledgerSumMinor"] == 7_000
    assert set(body) == {
        "accountId",
        "currency",
        "balanceMinor",
        "fence",
        "updatedAt",
        "ledgerSumMinor",
    }
    Account.objects.filter(account_id=acct.account_id).update(balance_minor=6_999)

    response = client.get(f"/v1/accounts/{acct.account_id}")

    assert response.status_code == 200
    assert (response.json()["balanceMinor"], response.json()["ledgerSumMinor"]) == (6_999, 7_000)


def test_account_read_of_an_unknown_account_is_not_found(client):
    response = client.get("/v1/accounts/nobody-here")
    assert response.status_code == 404 and response.json()["code"] == "NOT_FOUND"


def test_wrong_method_on_a_payment_path_is_an_envelope(client):
    response = client.get(f"/v1/payouts/{uuid.uuid4()}/claim")
    assert response.status_code == 405 and response.json()["code"] == "VALIDATION_FAILED"


def test_an_oversized_claim_body_is_413_validation_failed_and_changes_nothing(client):
    p = f.payout(f.account())
    before = f.snapshot(p)
    response = f.claim(client, p, f.next_token(), body={"expectedState": "P" * 70_000})
    assert response.status_code == 413
    assert response.json()["code"] == "VALIDATION_FAILED"
    assert f.snapshot(p) == before


def test_a_claim_body_that_is_not_json_is_validation_failed(client):
    p = f.payout(f.account())
    response = client.post(
        f"/v1/payouts/{p.payout_id}/claim",
        data="expectedState=PENDING",
        content_type="application/json",
        headers=f.headers(f.next_token(), "w1", p.idempotency_key),
    )
    assert response.status_code == 400 and response.json()["code"] == "VALIDATION_FAILED"
    assert Payout.objects.get(payout_id=p.payout_id).state == "PENDING"
