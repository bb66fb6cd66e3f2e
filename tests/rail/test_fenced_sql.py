"""railproxy.fenced_sql against real PostgreSQL: the strict high-water write and the revoke push."""

from __future__ import annotations

import uuid

import pytest
from django.db import connections, transaction

from dlock.dbrouter import alias_for
from railproxy import fenced_sql

pytestmark = pytest.mark.django_db(databases=["default"])


def _cursor():
    return connections[alias_for("railproxy")].cursor()


def test_high_water_advances_only_strictly_upwards():
    account, payout = f"acct-{uuid.uuid4().hex[:8]}", uuid.uuid4()
    with transaction.atomic(), _cursor() as cursor:
        assert fenced_sql.advance_high_water(cursor, account_id=account, token=5, payout_id=payout)
        assert (
            fenced_sql.advance_high_water(cursor, account_id=account, token=5, payout_id=payout)
            is None
        )
        assert (
            fenced_sql.advance_high_water(cursor, account_id=account, token=4, payout_id=payout)
            is None
        )
        assert fenced_sql.advance_high_water(cursor, account_id=account, token=6, payout_id=payout)
        assert fenced_sql.high_water(cursor, account_id=account) == 6


def test_equal_token_is_readmitted_only_for_the_payout_whose_attempt_was_not_sent():
    account, payout, other = f"acct-{uuid.uuid4().hex[:8]}", uuid.uuid4(), uuid.uuid4()
    with transaction.atomic(), _cursor() as cursor:
        fenced_sql.advance_high_water(cursor, account_id=account, token=9, payout_id=payout)
        assert fenced_sql.allow_same_token_retry(
            cursor, account_id=account, token=9, payout_id=payout
        )
        assert (
            fenced_sql.advance_high_water(cursor, account_id=account, token=9, payout_id=other)
            is None
        )
        assert fenced_sql.advance_high_water(cursor, account_id=account, token=9, payout_id=payout)
        # The allowance is single-use: the re-admission cleared it.
        assert (
            fenced_sql.advance_high_water(cursor, account_id=account, token=9, payout_id=payout)
            is None
        )
        # A newer token that touched the mark meanwhile forbids re-opening the old one.
        fenced_sql.advance_high_water(cursor, account_id=account, token=10, payout_id=other)
        assert not fenced_sql.allow_same_token_retry(
            cursor, account_id=account, token=9, payout_id=payout
        )


def test_raise_high_water_inserts_never_lowers_and_clears_the_retry_allowance():
    account, payout = f"acct-{uuid.uuid4().hex[:8]}", uuid.uuid4()
    with transaction.atomic(), _cursor() as cursor:
        assert fenced_sql.raise_high_water(cursor, account_id=account, floor=20) == 20
        assert fenced_sql.raise_high_water(cursor, account_id=account, floor=3) == 20
        fenced_sql.allow_same_token_retry(cursor, account_id=account, token=20, payout_id=payout)
        assert fenced_sql.raise_high_water(cursor, account_id=account, floor=21) == 21
        assert (
            fenced_sql.advance_high_water(cursor, account_id=account, token=21, payout_id=payout)
            is None
        )
        assert fenced_sql.advance_high_water(cursor, account_id=account, token=22, payout_id=payout)
