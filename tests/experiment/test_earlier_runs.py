"""A run on a stack where earlier runs left payouts claimable shares its executors with them:
the run counts those (`earlier_runs_claimable` in its report, a line in its table) so its
POSTED/s are never read as its own. Over real paydb."""

from __future__ import annotations

import uuid

import pytest
from django.db import connection

from experiment.measure import claimable_elsewhere
from experiment.report import shared_rates_line
from payments import seeding
from payments.models import Payout

pytestmark = pytest.mark.django_db(transaction=True)


def _psycopg_url() -> str:
    p = connection.settings_dict
    return f"postgresql://{p['USER']}:{p['PASSWORD'] or ''}@{p['HOST']}:{p['PORT']}/{p['NAME']}"


def _payouts(n: int) -> list[str]:
    account = seeding.create_account(
        account_id=f"acct-{uuid.uuid4().hex[:12]}", opening_balance_minor=100_000
    )
    return [
        str(seeding.create_payout(account_id=account.account_id, amount_minor=100).payout_id)
        for _ in range(n)
    ]


def test_claimable_payouts_of_other_runs_are_counted_and_settled_ones_are_not():
    url = _psycopg_url()
    ours = _payouts(3)
    before = claimable_elsewhere(url, ours)
    theirs = _payouts(4)
    Payout.objects.filter(payout_id=theirs[0]).update(state="CLAIMED")  # still claimable
    Payout.objects.filter(payout_id=theirs[1]).update(state="POSTED")  # settled: not counted
    Payout.objects.filter(payout_id=theirs[2]).update(state="RAIL_AMBIGUOUS")  # quarantined
    assert claimable_elsewhere(url, ours) == before + 2
    assert claimable_elsewhere(url, ours + theirs) == before


def test_the_report_says_when_the_rates_were_shared_with_earlier_runs():
    line = shared_rates_line("fenced", {"earlier_runs_claimable": 490})
    assert line is not None and "490" in line and "not comparable" in line
    assert shared_rates_line("fenced", {"earlier_runs_claimable": 0}) is None
    assert shared_rates_line("naive", {}) is None
