"""The payout reads other apps use (payments.selectors), on Django's and on a plain psycopg
cursor, over real paydb."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from django.db import connection

from payments import seeding, selectors
from payments.models import Payout

pytestmark = pytest.mark.django_db(transaction=True)


def _payouts() -> tuple[str, list[str]]:
    account = seeding.create_account(
        account_id=f"acct-{uuid.uuid4().hex[:12]}", opening_balance_minor=10_000
    )
    ids = [
        str(seeding.create_payout(account_id=account.account_id, amount_minor=a).payout_id)
        for a in (100, 200, 300)
    ]
    Payout.objects.filter(payout_id=ids[0]).update(state="RAIL_AMBIGUOUS")
    return account.account_id, ids


def _psycopg_url() -> str:
    p = connection.settings_dict
    return f"postgresql://{p['USER']}:{p['PASSWORD'] or ''}@{p['HOST']}:{p['PORT']}/{p['NAME']}"


def test_state_counts_summaries_and_in_states_agree_on_django_and_psycopg_cursors():
    account_id, ids = _payouts()
    with connection.cursor() as django_cursor, psycopg.connect(_psycopg_url()) as conn:
        for cursor in (django_cursor, conn.cursor()):
            assert selectors.payout_state_counts(cursor, payout_ids=ids) == {
                "RAIL_AMBIGUOUS": 1,
                "PENDING": 2,
            }
            assert sorted(selectors.payout_summaries(cursor, payout_ids=ids)) == sorted(
                [
                    (ids[0], account_id, "RAIL_AMBIGUOUS", 100),
                    (ids[1], account_id, "PENDING", 200),
                    (ids[2], account_id, "PENDING", 300),
                ]
            )
            ambiguous = selectors.payouts_in_states(cursor, states=("RAIL_AMBIGUOUS",))
            assert (ids[0], "RAIL_AMBIGUOUS") in ambiguous
            assert all(pid not in ids[1:] for pid, _ in ambiguous)


def test_payout_for_submission_reads_the_row_or_none():
    account_id, ids = _payouts()
    with connection.cursor() as cursor:
        row = selectors.payout_for_submission(cursor, payout_id=ids[1], for_update=True)
        missing = selectors.payout_for_submission(cursor, payout_id=uuid.uuid4())
    assert row[0] == account_id and row[1] == 200 and row[4] == "PENDING"
    assert missing is None
