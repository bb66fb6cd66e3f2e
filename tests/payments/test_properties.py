"""Hypothesis drives random claim/ack/post sequences with random tokens against real PostgreSQL.

After every step: balance = Σ entries, balance ≥ 0, the fence never decreases, and no payout is
posted twice (at most one DEBIT leg each; POSTED ⇔ exactly two legs).
"""

from __future__ import annotations

import pytest
from django.db import connections, transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlock.dbrouter import alias_for
from dlock.errors import ApiError
from payments import selectors, services
from payments.fenced_sql import payout as payout_sql
from payments.models import LedgerEntry, Payout
from tests.payments import factories as f

pytestmark = pytest.mark.django_db(databases=["default"], transaction=True)

N_PAYOUTS = 4
ACTIONS = ("claim", "reclaim", "ack", "ambiguous", "post", "post")

steps = st.lists(
    st.tuples(
        st.sampled_from(ACTIONS),
        st.integers(0, N_PAYOUTS - 1),
        st.integers(1, 30),
        st.sampled_from(["rr-a", "rr-b"]),
    ),
    min_size=1,
    max_size=20,
)


def _rail(payout, token: int, path: tuple[str, ...]) -> None:
    """Stand-in for the rail proxy's transitions (through the exported fenced function)."""
    alias = alias_for("payments")
    with transaction.atomic(using=alias), connections[alias].cursor() as cur:
        for src, dst in zip(path, path[1:], strict=False):
            if not payout_sql.transition_payout(
                cur,
                payout_id=payout.payout_id,
                from_states=(src,),
                to_state=dst,
                token=token,
                owner_id="proxy",
            ):
                return


def _apply(action, payout, token, ref) -> None:
    try:
        if action in ("claim", "reclaim"):
            services.claim_payout(
                payout_id=payout.payout_id,
                token=token,
                owner_id=f"w{token}",
                idempotency_key=payout.idempotency_key,
                expected_state="PENDING" if action == "claim" else "CLAIMED",
            )
        elif action == "ack":
            _rail(payout, token, ("CLAIMED", "SUBMITTING", "RAIL_ACKED"))
        elif action == "ambiguous":
            _rail(payout, token, ("CLAIMED", "SUBMITTING", "RAIL_AMBIGUOUS"))
        else:
            services.post_payout(
                payout_id=payout.payout_id,
                token=token,
                owner_id=f"w{token}",
                idempotency_key=payout.idempotency_key,
                rail_reference=ref,
                submission_id=payout.payout_id,
            )
    except ApiError as exc:
        assert exc.code.value in {
            "FENCED_OUT",
            "PAYOUT_NOT_CLAIMABLE",
            "INSUFFICIENT_FUNDS",
            "IDEMPOTENCY_CONFLICT",
        }, exc


@settings(
    max_examples=30,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    balance=st.integers(0, 3_000),
    amounts=st.lists(st.integers(1, 1_500), min_size=N_PAYOUTS, max_size=N_PAYOUTS),
    sequence=steps,
)
def test_random_claim_and_post_sequences_keep_the_books_straight(balance, amounts, sequence):
    acct = f.account(balance)
    payouts = [f.payout(acct, a) for a in amounts]
    fence = 0
    for action, index, token, ref in sequence:
        _apply(action, payouts[index], token, ref)

        account = selectors.get_account(account_id=acct.account_id)
        assert account["balanceMinor"] == account["ledgerSumMinor"]
        assert account["balanceMinor"] >= 0
        assert account["fence"] >= fence
        fence = account["fence"]
        posted_total = 0
        for p in Payout.objects.filter(account_id=acct.account_id):
            legs = list(LedgerEntry.objects.filter(payout_id=p.payout_id))
            assert sum(1 for leg in legs if leg.direction == "DEBIT") <= 1
            assert len(legs) == (2 if p.state == "POSTED" else 0)
            if p.state == "POSTED":
                posted_total += p.amount_minor
        assert balance - posted_total == account["balanceMinor"]
