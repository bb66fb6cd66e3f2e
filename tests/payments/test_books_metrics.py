"""payment-resource's own gauges of waiting work, read from paydb at scrape: the backlog's age
(so an alert fires with no executor) and open rail recoveries with the oldest one's age."""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone
from prometheus_client import CollectorRegistry, generate_latest

from payments.books_metrics import WaitingWorkCollector
from payments.models import Payout, RailRecovery
from tests.payments import factories as f

pytestmark = pytest.mark.django_db(databases=["default"])


def scrape() -> dict[str, float]:
    registry = CollectorRegistry()
    registry.register(WaitingWorkCollector())
    found = {}
    for line in generate_latest(registry).decode().splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            found[name] = float(value)
    return found


def test_nothing_waiting_reads_zero_for_every_series():
    assert scrape() == {
        'payout_backlog_oldest_age_seconds{state="PENDING"}': 0.0,
        'payout_backlog_oldest_age_seconds{state="CLAIMED"}': 0.0,
        "rail_recoveries_open": 0.0,
        "rail_recovery_oldest_open_age_seconds": 0.0,
    }


def test_the_oldest_pending_payout_and_open_recovery_are_aged_from_paydb():
    account = f.account(5_000)
    old = f.payout(account, 100)
    f.payout(account, 100)
    an_hour_ago = timezone.now() - dt.timedelta(hours=1)
    Payout.objects.filter(pk=old.pk).update(created_at=an_hour_ago)
    for ref, status in (("RR-open", "OPEN"), ("RR-done", "RECOVERED")):
        RailRecovery.objects.create(
            rail_reference=ref,
            client_ref=str(old.payout_id),
            payout=old,
            amount_minor=100,
            currency="EUR",
            status=status,
            classification="BOOKED_MULTIPLE",
            reason="duplicate ack",
            recorded_by="ops",
            closed_at=timezone.now() if status != "OPEN" else None,
            close_reference="ret-1" if status != "OPEN" else None,
        )
    RailRecovery.objects.filter(rail_reference="RR-open").update(
        recorded_at=timezone.now() - dt.timedelta(days=2)
    )

    found = scrape()

    assert 3_600 <= found['payout_backlog_oldest_age_seconds{state="PENDING"}'] < 3_700
    assert found["rail_recoveries_open"] == 1.0  # the closed one does not count
    assert 2 * 86_400 <= found["rail_recovery_oldest_open_age_seconds"] < 2 * 86_400 + 100
