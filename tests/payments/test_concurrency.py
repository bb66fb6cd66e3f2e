"""Real threads against real PostgreSQL: one winner per payout, balances never negative."""

from __future__ import annotations

import threading
from collections import Counter

import pytest
from django.db import connections

from dlock.errors import ApiError
from payments import selectors, services
from payments.models import Account, LedgerEntry, Payout, PayoutEvent
from tests.payments import factories as f

pytestmark = pytest.mark.django_db(databases=["default"], transaction=True)


def _race(calls):
    """Run each zero-argument call in its own thread, released together; collect outcomes."""
    barrier = threading.Barrier(len(calls))
    results: list = [None] * len(calls)

    def run(i, call):
        try:
            barrier.wait(timeout=10)
            results[i] = call()
        except ApiError as exc:
            results[i] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    return results


def _outcome(result) -> str:
    return result.code.value if isinstance(result, ApiError) else "OK"


def _claim(p, token, key=None):
    return lambda: services.claim_payout(
        payout_id=p.payout_id,
        token=token,
        owner_id=f"w{token}",
        idempotency_key=key or p.idempotency_key,
        expected_state="PENDING",
    )


def test_concurrent_claims_of_one_payout_with_different_tokens_have_one_winner():
    acct = f.account(10_000)
    p = f.payout(acct, 1_000)
    tokens = [f.next_token() for _ in range(8)]

    results = _race([_claim(p, t) for t in tokens])

    outcomes = Counter(_outcome(r) for r in results)
    assert outcomes["OK"] == 1
    assert set(outcomes) <= {"OK", "FENCED_OUT", "PAYOUT_NOT_CLAIMABLE"}
    winner = next(t for t, r in zip(tokens, results, strict=True) if _outcome(r) == "OK")
    row = Payout.objects.get(payout_id=p.payout_id)
    assert (row.state, row.claim_token, row.attempt_count) == ("CLAIMED", winner, 1)
    assert Account.objects.get(account_id=acct.account_id).fence == winner
    assert PayoutEvent.objects.filter(payout_id=p.payout_id, to_state="CLAIMED").count() == 1
    for r in results:
        if _outcome(r) == "FENCED_OUT":
            assert r.details["highestToken"] > r.details["presentedToken"]


def test_concurrent_claims_on_one_account_never_reserve_more_than_its_balance():
    acct = f.account(1_000)
    payouts = [f.payout(acct, 300) for _ in range(10)]
    tokens = [f.next_token() for _ in payouts]

    results = _race([_claim(p, t) for p, t in zip(payouts, tokens, strict=True)])

    outcomes = Counter(_outcome(r) for r in results)
    assert set(outcomes) <= {"OK", "FENCED_OUT", "INSUFFICIENT_FUNDS"}
    claimed = Payout.objects.filter(account_id=acct.account_id, state="CLAIMED")
    assert claimed.count() == outcomes["OK"] <= 3
    assert sum(p.amount_minor for p in claimed) <= 1_000

    # Post every claimed payout with its own token: older grants may be fenced out, but money
    # never goes below zero and the balance always equals the recomputed ledger sum.
    for p in claimed:
        Payout.objects.filter(payout_id=p.payout_id).update(state="RAIL_ACKED")
    post_results = _race(
        [
            (
                lambda p=p: services.post_payout(
                    payout_id=p.payout_id,
                    token=p.claim_token,
                    owner_id="w",
                    idempotency_key=p.idempotency_key,
                    rail_reference="rr",
                    submission_id=p.payout_id,
                )
            )
            for p in claimed
        ]
    )
    assert {_outcome(r) for r in post_results} <= {"OK", "FENCED_OUT"}
    account = selectors.get_account(account_id=acct.account_id)
    assert account["balanceMinor"] >= 0
    assert account["balanceMinor"] == account["ledgerSumMinor"]


def test_a_duplicate_claim_in_flight_replays_instead_of_reading_as_fenced_out():
    p = f.payout(f.account())
    token = f.next_token()
    before = f.fenced_count("account")

    results = _race([_claim(p, token) for _ in range(4)])

    assert all(_outcome(r) == "OK" for r in results)
    assert sum(r.replayed for r in results) == 3
    assert all(r.body == results[0].body for r in results)
    assert len({list(r.body).__repr__() for r in results}) == 1  # same key order too
    assert f.fenced_count("account") == before
    assert PayoutEvent.objects.filter(payout_id=p.payout_id, to_state="CLAIMED").count() == 1


def test_identical_posts_in_flight_book_once_and_the_twins_replay_the_same_answer():
    # The one-statement P3 (state, legs, balances and its record in one CTE): twins released
    # together serialise on the identity, one writes, the others replay its recorded answer.
    acct = f.account(5_000)
    p = f.payout(acct, 1_200)
    token = f.next_token()
    assert _outcome(_claim(p, token)()) == "OK"
    f.rail_acked(p)
    before = f.fenced_count("account")

    results = _race(
        [
            lambda: services.post_payout(
                payout_id=p.payout_id,
                token=token,
                owner_id="w",
                idempotency_key=p.idempotency_key,
                rail_reference="rr-twin",
                submission_id=p.payout_id,
            )
            for _ in range(4)
        ]
    )

    assert all(_outcome(r) == "OK" for r in results), results
    assert sum(r.replayed for r in results) == 3
    assert all(r.body == results[0].body for r in results)
    assert f.fenced_count("account") == before
    assert LedgerEntry.objects.filter(payout_id=p.payout_id).count() == 2
    assert PayoutEvent.objects.filter(payout_id=p.payout_id, to_state="POSTED").count() == 1
    account = selectors.get_account(account_id=acct.account_id)
    assert account["balanceMinor"] == 5_000 - 1_200 == account["ledgerSumMinor"]
    assert results[0].body["balanceMinor"] == 5_000 - 1_200
