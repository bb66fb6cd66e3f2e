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
