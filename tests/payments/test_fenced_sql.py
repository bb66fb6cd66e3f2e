"""The exported fenced-SQL functions other apps call: transition_payout, raise_account_fence."""

from __future__ import annotations

import uuid

import pytest
from django.db import connections, transaction

from dlock.dbrouter import alias_for
from dlock.errors import ApiError, Code
from payments.fenced_sql import account as account_sql
from payments.fenced_sql import payout as payout_sql
from payments.models import QUARANTINED_OR_TERMINAL, Account, Payout, PayoutEvent
from payments.operator import push_fence_floor

pytestmark = pytest.mark.django_db(databases=["default"])


def _cursor():
    return connections[alias_for("payments")].cursor()


def _payout(state: str = "CLAIMED") -> Payout:
    account = Account.objects.create(account_id=f"acct-{uuid.uuid4().hex[:12]}", currency="EUR")
    pid = uuid.uuid4()
    return Payout.objects.create(
        payout_id=pid,
        account=account,
        amount_minor=100,
        currency="EUR",
        beneficiary_ref="ben",
        state=state,
        idempotency_key=f"payout-{pid}",
    )


def test_transition_moves_the_payout_and_appends_its_event():
    payout = _payout("CLAIMED")
    with transaction.atomic(using=alias_for("payments")), _cursor() as cur:
        moved = payout_sql.transition_payout(
            cur,
            payout_id=payout.payout_id,
            from_states=("CLAIMED",),
            to_state="SUBMITTING",
            token=7,
            owner_id="w1",
        )
    assert moved is True
    payout.refresh_from_db()
    assert payout.state == "SUBMITTING"
    event = PayoutEvent.objects.get(payout=payout)
    assert (event.from_state, event.to_state, event.token, event.owner_id) == (
        "CLAIMED",
        "SUBMITTING",
        7,
        "w1",
    )


def test_transition_from_the_wrong_state_moves_nothing_and_writes_no_event():
    payout = _payout("PENDING")
    with transaction.atomic(using=alias_for("payments")), _cursor() as cur:
        moved = payout_sql.transition_payout(
            cur,
            payout_id=payout.payout_id,
            from_states=("CLAIMED", "SUBMITTING"),
            to_state="RAIL_ACKED",
            token=7,
            owner_id="w1",
        )
    assert moved is False
    payout.refresh_from_db()
    assert payout.state == "PENDING"
    assert not PayoutEvent.objects.filter(payout=payout).exists()


def test_transition_of_an_unknown_payout_is_false():
    with transaction.atomic(using=alias_for("payments")), _cursor() as cur:
        assert not payout_sql.transition_payout(
            cur,
            payout_id=uuid.uuid4(),
            from_states=("CLAIMED",),
            to_state="SUBMITTING",
            token=1,
            owner_id="w1",
        )


@pytest.mark.parametrize("state", sorted(QUARANTINED_OR_TERMINAL))
def test_no_token_bearing_transition_leaves_quarantine_and_the_row_stays(state):
    payout = _payout(state)
    with pytest.raises(ValueError), _cursor() as cur:
        payout_sql.transition_payout(
            cur,
            payout_id=payout.payout_id,
            from_states=(state,),
            to_state="CLAIMED",
            token=9,
            owner_id="w1",
        )
    row = Payout.objects.get(payout_id=payout.payout_id)
    assert (row.state, row.claim_token) == (state, None)
    assert not PayoutEvent.objects.filter(payout_id=payout.payout_id).exists()


def test_the_quarantine_set_is_rail_ambiguous_plus_the_terminal_states():
    assert {"RAIL_AMBIGUOUS", "POSTED", "FAILED", "ABANDONED"} == QUARANTINED_OR_TERMINAL
    assert QUARANTINED_OR_TERMINAL is QUARANTINED_OR_TERMINAL  # one definition


def test_raise_account_fence_never_lowers_it():
    payout = _payout()
    account_id = payout.account_id
    with transaction.atomic(using=alias_for("payments")), _cursor() as cur:
        assert account_sql.raise_account_fence(cur, account_id=account_id, floor=50) == 50
        assert account_sql.raise_account_fence(cur, account_id=account_id, floor=10) == 50
    assert Account.objects.get(account_id=account_id).fence == 50


def test_raise_account_fence_of_an_unknown_account_returns_none_and_creates_nothing():
    with transaction.atomic(using=alias_for("payments")), _cursor() as cur:
        assert account_sql.raise_account_fence(cur, account_id="nobody", floor=5) is None
    assert not Account.objects.filter(account_id="nobody").exists()


def test_the_revoke_push_of_an_unknown_account_is_not_found():
    with pytest.raises(ApiError) as caught, _cursor() as cur:
        push_fence_floor(cur, account_id="nobody", floor=5)
    assert caught.value.code is Code.NOT_FOUND
    assert caught.value.details == {"resource": "account", "id": "nobody"}
