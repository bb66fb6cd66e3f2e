"""The admin pages an operator closes the books with (Django test client over real paydb): the
statement's transfers on a payout's page with "Record as rail recovery…", the guarded record
and close forms, the resolve form preselecting what the finding allows, the payout's History
showing its resolution (also from the quarantine's page), every time to the second in UTC, and
messages that never capitalise an id."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth import get_user_model

from payments.models import PayoutReconciliation, RailRecovery
from tests.payments import factories as f

pytestmark = pytest.mark.django_db(databases=["default"])

PAYOUTS = "/admin/payments/payout"
QUARANTINE = "/admin/payments/quarantinedpayout"
RECOVERIES = "/admin/payments/railrecovery"
SECONDS_UTC = re.compile(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(\.\d{3})? UTC")


@pytest.fixture
def staff(client):
    user = get_user_model().objects.create(
        username="ops-dora", is_staff=True, is_superuser=True, is_active=True
    )
    client.force_login(user)
    return user


def finding(payout, classification: str, refs: list[str]) -> PayoutReconciliation:
    return PayoutReconciliation.objects.create(
        payout=payout,
        classification=classification,
        rail_transfer_count=len(refs),
        rail_references=refs,
        rail_transfers=[
            {"railReference": r, "amountMinor": payout.amount_minor, "currency": "EUR"}
            for r in refs
        ],
    )


def posted_twice():
    payout = f.payout(f.account(5_000), 700, state="POSTED")
    payout.rail_reference = "RR-own"
    payout.save(update_fields=["rail_reference"])
    finding(payout, "BOOKED_MULTIPLE", ["RR-dup", "RR-own"])
    return payout


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]] if response.context else []


def test_a_payout_page_offers_to_record_only_the_transfer_it_does_not_account_for(client, staff):
    payout = posted_twice()

    html = client.get(f"{PAYOUTS}/{payout.payout_id}/change/").content.decode()

    assert f"{RECOVERIES}/add/?transfer=RR-dup" in html
    assert "?transfer=RR-own" not in html and "this payout (POSTED)" in html
    assert SECONDS_UTC.search(html), "created/updated at to the second, in UTC"


def test_recording_from_the_admin_books_it_and_a_second_time_is_refused(client, staff):
    payout = posted_twice()

    done = client.post(
        f"{RECOVERIES}/add/", {"transfer": "RR-dup", "reason": "duplicate ack"}, follow=True
    )
    again = client.post(
        f"{RECOVERIES}/add/", {"transfer": "RR-dup", "reason": "duplicate ack"}, follow=True
    )
    own = client.post(
        f"{RECOVERIES}/add/", {"transfer": "RR-own", "reason": "own transfer"}, follow=True
    )

    recovery = RailRecovery.objects.get(rail_reference="RR-dup")
    assert (recovery.status, recovery.payout_id, recovery.recorded_by) == (
        "OPEN",
        payout.payout_id,
        "ops-dora",
    )
    assert any("rail recovery recorded for transfer RR-dup" in m for m in messages_of(done))
    assert any("already has a recovery" in m for m in messages_of(again))
    assert any("the one payout" in m for m in messages_of(own))
    assert RailRecovery.objects.count() == 1
    history = client.get(f"{PAYOUTS}/{payout.payout_id}/history/").content.decode()
    assert "rail recovery recorded for transfer RR-dup" in history
    assert "refused: record rail recovery RR-own" in history


def test_closing_from_the_admin_needs_a_reference_or_a_reason_and_happens_once(client, staff):
    posted_twice()
    client.post(f"{RECOVERIES}/add/", {"transfer": "RR-dup", "reason": "duplicate ack"})
    recovery = RailRecovery.objects.get(rail_reference="RR-dup")
    close = f"{RECOVERIES}/{recovery.pk}/close/"

    page = client.get(f"{RECOVERIES}/{recovery.pk}/change/").content.decode()
    assert close in page
    missing = client.post(close, {"outcome": "RECOVERED"}, follow=True)
    assert any("needs the rail's reference" in m for m in messages_of(missing))
    client.post(close, {"outcome": "WRITTEN_OFF", "reason": "the beneficiary is gone"})
    twice = client.post(close, {"outcome": "RECOVERED", "reference": "ret-1"}, follow=True)

    recovery.refresh_from_db()
    assert recovery.status == "WRITTEN_OFF" and recovery.close_reason == "the beneficiary is gone"
    assert any("already WRITTEN_OFF" in m for m in messages_of(twice))
    assert close not in client.get(f"{RECOVERIES}/{recovery.pk}/change/").content.decode()


@pytest.mark.parametrize(
    ("classification", "refs", "preselected"),
    [("NOT_BOOKED", [], "FAILED"), ("BOOKED_ONCE", ["RR-1"], "POSTED"), ("NO_SUBMISSION", [], "")],
)
def test_the_resolve_form_preselects_what_the_finding_allows(
    client, staff, classification, refs, preselected
):
    payout = f.payout(f.account(5_000), 700, state="RAIL_AMBIGUOUS")
    finding(payout, classification, refs)

    form = client.get(f"{QUARANTINE}/{payout.payout_id}/resolve/").context["form"]

    assert (form["resolution"].value() or "") == preselected


def test_a_resolution_shows_in_the_payouts_history_and_no_message_capitalises_its_id(client, staff):
    payout = f.payout(f.account(5_000), 700, state="RAIL_AMBIGUOUS")
    finding(payout, "NOT_BOOKED", [])
    refused = client.post(
        f"{QUARANTINE}/{payout.payout_id}/resolve/",
        {"resolution": "POSTED", "note": "paid, surely"},
    )
    done = client.post(
        f"{QUARANTINE}/{payout.payout_id}/resolve/",
        {"resolution": "FAILED", "note": "not on the statement"},
        follow=True,
    )

    for message in messages_of(refused) + messages_of(done):
        assert message.startswith("payout "), message  # the admin capitalises only "payout"
    history = client.get(f"{QUARANTINE}/{payout.payout_id}/history/", follow=True)
    text = history.content.decode()
    assert history.redirect_chain[-1][0].endswith(f"{PAYOUTS}/{payout.payout_id}/history/")
    assert "resolved RAIL_AMBIGUOUS → FAILED" in text and "refused: resolve as POSTED" in text
    assert SECONDS_UTC.search(text), "the history's times to the second, in UTC"


def test_the_admin_says_rail_recoveries():
    from payments.models import RailRecovery

    assert str(RailRecovery._meta.verbose_name_plural) == "rail recoveries"


@pytest.fixture
def viewer(client):
    """Staff with only the two view permissions (not a superuser)."""
    from django.contrib.auth.models import Permission

    user = get_user_model().objects.create(username="ops-vic", is_staff=True, is_active=True)
    user.user_permissions.set(
        Permission.objects.filter(codename__in=["view_payoutreversal", "view_operatorrefusal"])
    )
    client.force_login(user)
    return user


def test_reversals_and_refusals_are_listed_read_only_with_times_in_utc(client, viewer):
    from payments.models import OperatorRefusal, PayoutReversal

    payout = f.payout(f.account(5_000), 700, state="FAILED")
    reversal = PayoutReversal.objects.create(
        payout=payout,
        rail_reference="RR-not-on-statement",
        amount_minor=700,
        currency="EUR",
        classification="NOT_BOOKED",
        statement_references=[],
        reason="the statement lacks RR-not-on-statement",
        reversed_by="ops-dora",
    )
    refusal = OperatorRefusal.objects.create(
        operator="ops-eve",
        known_user=False,
        action="resolve POSTED",
        object_type="payout",
        object_id=str(payout.pk),
        reason="the statement lacks the reference",
    )

    for section, row, marker in (
        ("payoutreversal", reversal.pk, "RR-not-on-statement"),
        ("operatorrefusal", refusal.pk, "ops-eve"),
    ):
        listed = client.get(f"/admin/payments/{section}/")
        assert listed.status_code == 200
        page = listed.content.decode()
        assert marker in page and SECONDS_UTC.search(page)
        assert f"/admin/payments/{section}/add/" not in page  # no "Add" button
        shown = client.get(f"/admin/payments/{section}/{row}/change/")
        assert shown.status_code == 200 and SECONDS_UTC.search(shown.content.decode())
        assert 'name="_save"' not in shown.content.decode()  # view-only: no Save
        assert client.get(f"/admin/payments/{section}/add/").status_code == 403
        assert client.post(f"/admin/payments/{section}/{row}/change/", {}).status_code == 403
        assert (
            client.post(f"/admin/payments/{section}/{row}/delete/", {"post": "yes"}).status_code
            == 403
        )
    assert PayoutReversal.objects.filter(pk=reversal.pk).exists()
    assert OperatorRefusal.objects.filter(pk=refusal.pk).exists()


def test_a_superuser_cannot_add_change_or_delete_a_reversal_either(client, staff):
    from django.contrib import admin as django_admin

    from payments.models import OperatorRefusal, PayoutReversal

    request = type("Request", (), {"user": staff})()
    for model in (PayoutReversal, OperatorRefusal):
        model_admin = django_admin.site._registry[model]
        assert model_admin.has_view_permission(request)
        assert not model_admin.has_add_permission(request)
        assert not model_admin.has_change_permission(request)
        assert not model_admin.has_delete_permission(request)
