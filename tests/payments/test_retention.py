"""`manage.py purge_idempotency`: idempotency records older than the window whose payout has
ended are deleted; newer ones, and old ones of a quarantined or live payout, stay (rows found by
id). Before, nothing ever purged idempotency_record (1.25 KB per payout, forever)."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from payments.models import IdempotencyRecord
from tests.payments import factories

pytestmark = pytest.mark.django_db(transaction=True)


def record(payout_id, *, age_days: float) -> int:
    row = IdempotencyRecord.objects.create(
        operation="claim",
        idempotency_key=f"k-{uuid.uuid4().hex}",
        token=factories.next_token(),
        request_hash="0" * 64,
        payout_id=payout_id,
        status=200,
        body="{}",
    )
    IdempotencyRecord.objects.filter(id=row.id).update(
        created_at=timezone.now() - dt.timedelta(days=age_days)
    )
    return row.id


def kept(*ids: int) -> set[int]:
    return set(IdempotencyRecord.objects.filter(id__in=ids).values_list("id", flat=True))


def test_old_records_of_ended_payouts_go_new_ones_and_unended_payouts_stay(capsys):
    acct = factories.account(balance=100_000)
    posted = factories.payout(acct, state="POSTED")
    failed = factories.payout(acct, state="FAILED")
    ambiguous = factories.payout(acct, state="RAIL_AMBIGUOUS")
    claimed = factories.payout(acct, state="CLAIMED")
    old_posted = record(posted.payout_id, age_days=8)
    old_failed = record(failed.payout_id, age_days=30)
    old_nameless = record(None, age_days=8)
    new_posted = record(posted.payout_id, age_days=6)
    old_ambiguous = record(ambiguous.payout_id, age_days=60)
    old_claimed = record(claimed.payout_id, age_days=60)
    everyone = (old_posted, old_failed, old_nameless, new_posted, old_ambiguous, old_claimed)

    call_command("purge_idempotency", "--dry-run")
    assert kept(*everyone) == set(everyone)
    assert "would delete 3 record(s) older than 7 day(s)" in capsys.readouterr().out

    call_command("purge_idempotency")
    assert kept(*everyone) == {new_posted, old_ambiguous, old_claimed}
    assert "deleted 3 record(s)" in capsys.readouterr().out

    call_command("purge_idempotency", "--older-than-days", "5")
    assert kept(*everyone) == {old_ambiguous, old_claimed}


@pytest.mark.parametrize("days", ["0", "-1", "36501", "2147483648"])
def test_a_window_outside_a_day_to_a_century_is_refused_and_nothing_is_deleted(days):
    acct = factories.account()
    old = record(factories.payout(acct, state="POSTED").payout_id, age_days=8)
    with pytest.raises(CommandError) as refused:
        call_command("purge_idempotency", "--older-than-days", days)
    assert refused.value.returncode == 2 and "1 to 36500" in str(refused.value)
    assert kept(old) == {old}
