"""Staff admin (quarantine + resolve through the services) and manage.py seed_payouts."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command

from dlock.errors import ApiError
from payments import selectors, services
from payments.models import (
    Account,
    LedgerEntry,
    Payout,
    PayoutEvent,
    PayoutReconciliation,
)
from tests.payments import factories as f

pytestmark = pytest.mark.django_db(databases=["default"])


@pytest.fixture
def staff(client):
    # No password: force_login needs none, and hashing one costs most of a second.
    user = get_user_model().objects.create(
        username="ops-alice", is_staff=True, is_superuser=True, is_active=True
    )
    client.force_login(user)
    return user


def _ambiguous(amount: int = 700):
    acct = f.account(5_000)
    p = f.payout(acct, amount, state="RAIL_AMBIGUOUS")
    return acct, p


def _resolve_action(client, payout, form: dict | None = None):
    """POST the changelist's "resolve" action for one payout, with the action form's fields."""
    return client.post(
        "/admin/payments/quarantinedpayout/",
        {"action": "resolve_selected", "_selected_action": [str(payout.payout_id)], **(form or {})},
    )


def test_quarantine_lists_ambiguous_payouts_with_the_reconciler_classification(client, staff):
    _, p = _ambiguous()
    _, unreconciled = _ambiguous()
    pending = f.payout(f.account())
    PayoutReconciliation.objects.create(
        payout=p, classification="BOOKED_ONCE", rail_transfer_count=1, rail_references=["RR-77"]
    )

    page = client.get("/admin/payments/quarantinedpayout/")

    assert page.status_code == 200
    html = page.content.decode()
    assert str(p.payout_id) in html and "BOOKED_ONCE" in html and "RR-77" in html
    assert str(unreconciled.payout_id) in html and "not yet reconciled" in html
    assert str(pending.payout_id) not in html


def test_payout_admin_shows_the_event_timeline_and_filters_by_state(client, staff):
    p = f.payout(f.account())
    assert client.get("/admin/payments/payout/?state__exact=PENDING").status_code == 200
    detail = client.get(f"/admin/payments/payout/{p.payout_id}/change/")
    assert detail.status_code == 200
    assert "PENDING" in detail.content.decode()
    assert client.get("/admin/payments/ledgerentry/").status_code == 200
    assert client.get("/admin/payments/account/").status_code == 200


def test_admin_is_staff_only(client):
    response = client.get("/admin/payments/quarantinedpayout/")
    assert response.status_code == 302 and "/admin/login/" in response["Location"]


def test_resolve_action_without_a_note_changes_nothing(client, staff):
    _, p = _ambiguous()
    response = _resolve_action(client, p, {"apply": "1", "resolution": "POSTED", "note": "   "})
    assert response.status_code == 200  # the form again, with its error
    assert Payout.objects.get(payout_id=p.payout_id).state == "RAIL_AMBIGUOUS"
    assert not LedgerEntry.objects.filter(payout_id=p.payout_id).exists()


def test_resolve_action_posts_with_the_ledger_and_records_the_operator(client, staff):
    acct, p = _ambiguous(700)
    # The guard (payments.resolve): POSTED needs the reconciler's BOOKED_ONCE and its reference.
    PayoutReconciliation.objects.create(
        payout=p, classification="BOOKED_ONCE", rail_transfer_count=1, rail_references=["RR-77"]
    )
    response = _resolve_action(
        client,
        p,
        {
            "apply": "1",
            "resolution": "POSTED",
            "note": "rail statement shows RR-77 booked once",
            "rail_reference": "RR-77",
        },
    )
    assert response.status_code == 302
    row = Payout.objects.get(payout_id=p.payout_id)
    assert (row.state, row.rail_reference) == ("POSTED", "RR-77")
    event = PayoutEvent.objects.filter(payout_id=p.payout_id).latest("id")
    assert (event.from_state, event.to_state, event.owner_id, event.token) == (
        "RAIL_AMBIGUOUS",
        "POSTED",
        "operator:ops-alice",
        None,
    )
    assert "booked once" in event.note
    account = selectors.get_account(account_id=acct.account_id)
    assert account["balanceMinor"] == account["ledgerSumMinor"] == 4_300
    assert LedgerEntry.objects.filter(payout_id=p.payout_id).count() == 2


def test_resolve_to_failed_releases_the_reservation_and_moves_no_money(staff):
    acct, p = _ambiguous(700)
    services.resolve_quarantined(
        payout_id=p.payout_id, resolution="FAILED", operator="bob", note="not on the statement"
    )
    assert Payout.objects.get(payout_id=p.payout_id).state == "FAILED"
    assert Account.objects.get(account_id=acct.account_id).balance_minor == 5_000
    assert not LedgerEntry.objects.filter(payout_id=p.payout_id).exists()


@pytest.mark.parametrize("state", ["PENDING", "CLAIMED", "RAIL_ACKED", "POSTED", "FAILED"])
def test_only_quarantined_payouts_can_be_resolved(state):
    p = f.payout(f.account(), state=state)
    with pytest.raises(ApiError) as caught:
        services.resolve_quarantined(
            payout_id=p.payout_id, resolution="POSTED", operator="bob", note="n"
        )
    assert caught.value.code.value == "PAYOUT_NOT_CLAIMABLE"
    assert Payout.objects.get(payout_id=p.payout_id).state == state


def test_seed_payouts_prints_ids_and_opens_balances_as_ledger_pairs():
    out = StringIO()
    call_command(
        "seed_payouts",
        "--accounts=2",
        "--payouts-per-account=3",
        "--balance-minor=50000",
        "--amount-minor=1200",
        "--json",
        stdout=out,
    )
    seeded = json.loads(out.getvalue())
    assert set(seeded) == {"accounts", "payouts"}
    assert len(seeded["accounts"]) == 2 and len(seeded["payouts"]) == 6
    for account_id in seeded["accounts"]:
        account = selectors.get_account(account_id=account_id)
        assert account["balanceMinor"] == account["ledgerSumMinor"] == 50_000
    payouts = Payout.objects.filter(payout_id__in=seeded["payouts"])
    assert {(p.state, p.amount_minor, p.currency) for p in payouts} == {("PENDING", 1200, "EUR")}
    assert all(p.idempotency_key == f"payout-{p.payout_id}" for p in payouts)


@pytest.mark.parametrize(
    "args",
    [
        ["--accounts=0", "--payouts-per-account=1", "--balance-minor=1", "--amount-minor=1"],
        ["--accounts=1", "--payouts-per-account=1", "--balance-minor=1", "--amount-minor=0"],
        ["--accounts=1", "--payouts-per-account=1", "--balance-minor=-1", "--amount-minor=1"],
        [
            "--accounts=1",
            "--payouts-per-account=1",
            "--balance-minor=1",
            "--amount-minor=1",
            "--currency=eur",
        ],
    ],
)
def test_seed_payouts_rejects_bad_arguments(args):
    with pytest.raises(CommandError):
        call_command("seed_payouts", *args)


def test_resolve_action_first_asks_for_a_resolution_and_a_note(client, staff):
    _, p = _ambiguous()
    response = _resolve_action(client, p)
    assert response.status_code == 200
    html = response.content.decode()
    assert 'name="note"' in html and 'name="resolution"' in html and str(p.payout_id) in html
    assert Payout.objects.get(payout_id=p.payout_id).state == "RAIL_AMBIGUOUS"


def test_quarantined_payout_page_is_read_only_with_its_timeline(client, staff):
    _, p = _ambiguous()
    page = client.get(f"/admin/payments/quarantinedpayout/{p.payout_id}/change/")
    assert page.status_code == 200
    assert 'name="state"' not in page.content.decode()  # no editable state field
