"""P2's transition and P3's whole posting are one statement each, and each command's first
statement is "the identity's record, else the fence" (issue 18): the answers, rows and books
are what they were with a statement per step."""

from __future__ import annotations

import uuid

import pytest

from payments.models import Account, IdempotencyRecord, LedgerEntry, PayoutEvent
from tests.payments import factories as f

pytestmark = pytest.mark.django_db(databases=["default"])


def _books_balance() -> None:
    """Every account's balance (a settlement account's: its row plus its buckets) is the sum
    of its ledger legs (CREDIT +, DEBIT −)."""
    rows = f.books()
    assert rows
    assert [r for r in rows if r[1] != r[2]] == []


def test_the_first_post_in_a_currency_creates_its_settlement_account_and_the_books_balance(
    client,
):
    acct = f.account(10_000, currency="NOK")
    assert not Account.objects.filter(account_id="settlement:NOK").exists()
    p = f.payout(acct, 1_250)
    token = f.next_token()
    assert f.claim(client, p, token).status_code == 200
    f.rail_acked(p)

    response = f.post(client, p, token)

    assert response.status_code == 200, response.content
    body = response.json()
    assert body["state"] == "POSTED" and body["balanceMinor"] == 8_750
    assert [(e["direction"], e["amountMinor"], e["fence"]) for e in body["entries"]] == [
        ("DEBIT", 1_250, token),
        ("CREDIT", 1_250, token),
    ]
    settlement = Account.objects.get(account_id="settlement:NOK")
    assert (settlement.kind, settlement.currency, f.balance("settlement:NOK")) == (
        "SETTLEMENT",
        "NOK",
        1_250,
    )
    legs = {
        str(e.entry_id): (e.account_id, e.direction, e.amount_minor, e.fence)
        for e in LedgerEntry.objects.filter(payout_id=p.payout_id)
    }
    assert legs == {
        body["entries"][0]["entryId"]: (acct.account_id, "DEBIT", 1_250, token),
        body["entries"][1]["entryId"]: ("settlement:NOK", "CREDIT", 1_250, token),
    }
    events = PayoutEvent.objects.filter(payout_id=p.payout_id).order_by("at")
    assert [(e.from_state, e.to_state, e.token) for e in events][-1] == (
        "RAIL_ACKED",
        "POSTED",
        token,
    )
    # A second payout credits the now existing settlement account.
    q = f.payout(acct, 750)
    token2 = f.next_token()
    assert f.claim(client, q, token2).status_code == 200
    f.rail_acked(q)
    second = f.post(client, q, token2)
    assert second.status_code == 200 and second.json()["balanceMinor"] == 8_000
    assert f.balance("settlement:NOK") == 2_000
    _books_balance()


def test_a_post_replay_answers_the_recorded_body_and_writes_nothing(client):
    acct = f.account(10_000)
    p = f.payout(acct, 1_000)
    token = f.next_token()
    assert f.claim(client, p, token).status_code == 200
    f.rail_acked(p)
    body = {"railReference": "rr-replay", "submissionId": str(uuid.uuid4())}
    first = f.post(client, p, token, body=body)
    assert first.status_code == 200
    before = f.snapshot(p)

    replay = f.post(client, p, token, body=body)

    assert replay.status_code == 200 and replay["Idempotent-Replayed"] == "true"
    assert replay.content == first.content
    assert f.snapshot(p) == before
    assert IdempotencyRecord.objects.filter(payout_id=p.payout_id, operation="post").count() == 1
    _books_balance()


def test_a_claim_replay_answers_the_recorded_body_and_writes_nothing(client):
    p = f.payout(f.account(10_000), 1_000)
    token = f.next_token()
    first = f.claim(client, p, token)
    assert first.status_code == 200
    assert first.json()["attemptCount"] == 1
    assert first.json()["idempotencyKey"] == p.idempotency_key
    before = f.snapshot(p)

    replay = f.claim(client, p, token)

    assert replay.status_code == 200 and replay["Idempotent-Replayed"] == "true"
    assert replay.content == first.content
    assert f.snapshot(p) == before


def test_a_fenced_out_post_changes_no_row(client):
    acct = f.account(10_000)
    p = f.payout(acct, 1_000)
    stale, newer = f.next_token(), f.next_token()
    assert f.claim(client, p, newer).status_code == 200
    f.rail_acked(p)
    before = f.snapshot(p)

    response = f.post(client, p, stale)

    assert response.status_code == 409 and response.json()["code"] == "FENCED_OUT"
    assert response.json()["details"]["highestToken"] == newer
    assert f.snapshot(p) == before
    _books_balance()


def test_a_post_of_a_payout_not_rail_acked_writes_nothing_not_even_the_fence(client):
    acct = f.account(10_000)
    p = f.payout(acct, 1_000)
    token = f.next_token()
    assert f.claim(client, p, token).status_code == 200
    before = f.snapshot(p)

    response = f.post(client, p, token + 1)  # a newer grant: the fence UPDATE itself would move

    assert response.status_code == 409 and response.json()["code"] == "PAYOUT_NOT_CLAIMABLE"
    assert f.snapshot(p) == before  # the fence moved inside the transaction, then rolled back


def test_post_hot_path_query_count(client, django_assert_num_queries):
    p = f.payout(f.account())
    token = f.next_token()
    assert f.claim(client, p, token).status_code == 200
    f.rail_acked(p)
    # savepoint + (idempotency lock, record or fenced UPDATE, the posting with its event, legs,
    # the debit, the settlement bucket's credit and record) + release savepoint; the payout's
    # account for the proof is kept
    with django_assert_num_queries(5):
        response = f.post(client, p, token)
    assert response.status_code == 200
