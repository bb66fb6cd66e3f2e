"""The guarded, audited resolve (payments.resolve) and the quarantine detail page an operator reads.

POSTED only on BOOKED_ONCE with the statement's reference, FAILED only on NOT_BOOKED, anything
else refused unless overridden with a written reason; each resolution leaves a payout_event row,
a Django LogEntry and a `payout_resolved` log event, and the books stay balanced.
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth import get_user_model

from dlock.errors import ApiError
from payments import selectors
from payments.models import LedgerEntry, Payout, PayoutEvent, PayoutReconciliation
from payments.resolve import resolve_payout
from railproxy.models import RailSubmission
from tests.payments import factories as f

pytestmark = pytest.mark.django_db(databases=["default"])

QUARANTINE = "/admin/payments/quarantinedpayout"


@pytest.fixture
def staff(client):
    user = get_user_model().objects.create(
        username="ops-carol", is_staff=True, is_superuser=True, is_active=True
    )
    client.force_login(user)
    return user


def quarantined(classification: str | None, refs=("RR-9",), amount: int = 700):
    acct = f.account(5_000)
    p = f.payout(acct, amount, state="RAIL_AMBIGUOUS")
    if classification is not None:
        PayoutReconciliation.objects.create(
            payout=p,
            classification=classification,
            rail_transfer_count=len(refs),
            rail_references=list(refs),
        )
    return acct, p


def books_balanced(acct) -> tuple[int, int]:
    account = selectors.get_account(account_id=acct.account_id)
    assert account["balanceMinor"] == account["ledgerSumMinor"]
    return account["balanceMinor"], LedgerEntry.objects.filter(payout__isnull=False).count()


def resolve_page(client, p, **form):
    return client.post(f"{QUARANTINE}/{p.payout_id}/resolve/", form)


def unchanged(p, acct) -> None:
    row = Payout.objects.get(payout_id=p.payout_id)
    assert row.state == "RAIL_AMBIGUOUS" and row.rail_reference is None
    assert not LedgerEntry.objects.filter(payout_id=p.payout_id).exists()
    # A refusal is audited (issue 26): only "refused: …" history rows, on the payout itself.
    messages = LogEntry.objects.filter(object_id=str(p.payout_id)).values_list(
        "change_message", flat=True
    )
    assert all(m.startswith("refused: ") for m in messages)
    assert not PayoutEvent.objects.filter(payout_id=p.payout_id, owner_id__startswith="operator:")
    assert books_balanced(acct)[0] == 5_000


def events_of(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "event", None) == "payout_resolved"]


def test_booked_once_with_the_statement_reference_posts_and_is_audited_three_ways(
    client, staff, caplog, django_capture_on_commit_callbacks
):
    acct, p = quarantined("BOOKED_ONCE", ["RR-9"])
    with caplog.at_level(logging.INFO), django_capture_on_commit_callbacks(execute=True):
        response = resolve_page(
            client, p, resolution="POSTED", rail_reference="RR-9", note="statement line 4"
        )

    assert response.status_code == 302
    row = Payout.objects.get(payout_id=p.payout_id)
    assert (row.state, row.rail_reference) == ("POSTED", "RR-9")
    assert books_balanced(acct)[0] == 4_300
    assert LedgerEntry.objects.filter(payout_id=p.payout_id).count() == 2
    event = PayoutEvent.objects.filter(payout_id=p.payout_id).latest("id")
    assert (event.from_state, event.to_state, event.owner_id) == (
        "RAIL_AMBIGUOUS",
        "POSTED",
        "operator:ops-carol",
    )
    entry = LogEntry.objects.get(object_id=str(p.payout_id))
    assert entry.user_id == staff.pk
    assert entry.content_type.model_class() is Payout  # its own History page shows it
    assert entry.change_message == (
        "resolved RAIL_AMBIGUOUS → POSTED (reference RR-9, reconciler BOOKED_ONCE): "
        "statement line 4"
    )
    (logged,) = events_of(caplog)
    assert logged.levelno == logging.INFO
    assert (logged.operator, getattr(logged, "from"), logged.to, logged.reference) == (
        "ops-carol",
        "RAIL_AMBIGUOUS",
        "POSTED",
        "RR-9",
    )
    assert logged.note == "statement line 4" and logged.override is False


def test_posted_defaults_to_the_single_reference_the_reconciler_found(staff):
    acct, p = quarantined("BOOKED_ONCE", ["RR-10"])
    done = resolve_payout(payout_id=p.payout_id, resolution="POSTED", user=staff, note="ok")
    assert done["reference"] == "RR-10"
    assert Payout.objects.get(payout_id=p.payout_id).rail_reference == "RR-10"
    assert books_balanced(acct)[0] == 4_300


def test_not_booked_resolves_failed_and_moves_no_money(staff):
    acct, p = quarantined("NOT_BOOKED", [])
    resolve_payout(payout_id=p.payout_id, resolution="FAILED", user=staff, note="no transfer")
    assert Payout.objects.get(payout_id=p.payout_id).state == "FAILED"
    assert books_balanced(acct)[0] == 5_000
    assert not LedgerEntry.objects.filter(payout_id=p.payout_id).exists()
    assert LogEntry.objects.filter(object_id=str(p.payout_id)).count() == 1


@pytest.mark.parametrize(
    ("classification", "refs", "resolution", "reference", "why"),
    [
        ("NOT_BOOKED", [], "POSTED", "RR-1", "needs classification BOOKED_ONCE"),
        (None, [], "POSTED", "RR-1", "not classified"),
        (None, [], "FAILED", None, "not classified"),
        ("BOOKED_MULTIPLE", ["RR-1", "RR-2"], "POSTED", "RR-1", "exactly one booked transfer"),
        ("BOOKED_ONCE", ["RR-1"], "POSTED", "RR-999", "not the one on the rail's statement"),
        ("BOOKED_ONCE", ["RR-1"], "FAILED", None, "needs classification NOT_BOOKED"),
        ("NO_SUBMISSION", [], "FAILED", None, "says NO_SUBMISSION"),
    ],
)
def test_a_resolution_the_reconciler_does_not_back_is_refused_and_writes_nothing(
    client, staff, classification, refs, resolution, reference, why
):
    acct, p = quarantined(classification, refs)
    form = {"resolution": resolution, "note": "looks fine to me"}
    if reference:
        form["rail_reference"] = reference

    response = resolve_page(client, p, **form)

    assert response.status_code == 200  # the form again, with the refusal
    assert why in response.content.decode().replace("&#x27;", "'")
    unchanged(p, acct)


def test_a_reconciliation_older_than_the_quarantine_is_refused(staff):
    acct, p = quarantined("NOT_BOOKED", [])
    PayoutReconciliation.objects.filter(payout_id=p.payout_id).update(
        checked_at=dt.datetime(2020, 1, 1, tzinfo=dt.UTC)
    )
    PayoutEvent.objects.create(payout_id=p.payout_id, to_state="RAIL_AMBIGUOUS", owner_id="sweep")
    with pytest.raises(ApiError) as caught:
        resolve_payout(payout_id=p.payout_id, resolution="FAILED", user=staff, note="n")
    assert "predates the quarantine" in caught.value.message
    unchanged(p, acct)


def test_an_override_needs_a_reason_of_twenty_characters(client, staff):
    acct, p = quarantined("NOT_BOOKED", [])
    response = resolve_page(
        client, p, resolution="POSTED", rail_reference="RR-5", note="trust me", override="on"
    )
    assert response.status_code == 200
    assert "at least 20 characters" in response.content.decode()
    unchanged(p, acct)
    with pytest.raises(ApiError):
        resolve_payout(
            payout_id=p.payout_id, resolution="POSTED", user=staff, note="x" * 19, override=True
        )
    unchanged(p, acct)


def test_an_override_with_a_reason_resolves_and_is_logged_at_warning(
    client, staff, caplog, django_capture_on_commit_callbacks
):
    acct, p = quarantined("BOOKED_MULTIPLE", ["RR-42", "RR-43"])
    reason = "rail support ticket 4411 confirms RR-42 is this payout's own transfer"
    with caplog.at_level(logging.INFO), django_capture_on_commit_callbacks(execute=True):
        response = resolve_page(
            client, p, resolution="POSTED", rail_reference="RR-42", note=reason, override="on"
        )
    assert response.status_code == 302
    assert Payout.objects.get(payout_id=p.payout_id).state == "POSTED"
    assert books_balanced(acct)[0] == 4_300
    (logged,) = events_of(caplog)
    assert logged.levelno == logging.WARNING and logged.override is True
    assert logged.note == reason and "exactly one booked transfer" in logged.refusal
    event = PayoutEvent.objects.filter(payout_id=p.payout_id).latest("id")
    assert event.note.startswith("OVERRIDE (") and reason in event.note
    entry = LogEntry.objects.get(object_id=str(p.payout_id))
    assert " OVERRIDE: " in entry.change_message


def test_no_override_posts_a_reference_the_statement_lacks(client, staff):
    """Decision 20: the admin (no raildb) checks the reconciler's reading of the statement."""
    acct, p = quarantined(None, [])
    response = resolve_page(
        client,
        p,
        resolution="POSTED",
        rail_reference="RR-42",
        note="rail support ticket 4411 confirms booking RR-42 by phone",
        override="on",
    )
    assert response.status_code == 200
    assert "not on the rail&#x27;s statement" in response.content.decode()
    unchanged(p, acct)


def test_the_changelist_action_goes_through_the_same_guard(client, staff):
    acct, p = quarantined("NOT_BOOKED", [])
    response = client.post(
        f"{QUARANTINE}/",
        {
            "action": "resolve_selected",
            "_selected_action": [str(p.payout_id)],
            "apply": "1",
            "resolution": "POSTED",
            "rail_reference": "RR-1",
            "note": "looks fine to me",
        },
    )
    assert response.status_code == 302
    unchanged(p, acct)


def test_only_a_quarantined_payout_can_be_resolved(staff):
    acct = f.account(5_000)
    p = f.payout(acct, 700, state="CLAIMED")
    with pytest.raises(ApiError) as caught:
        resolve_payout(payout_id=p.payout_id, resolution="FAILED", user=staff, note="n")
    assert caught.value.code.value == "PAYOUT_NOT_CLAIMABLE"
    assert Payout.objects.get(payout_id=p.payout_id).state == "CLAIMED"


def test_the_detail_page_shows_the_evidence_in_utc_seconds_and_offers_no_save(client, staff):
    acct, p = quarantined("BOOKED_ONCE", ["RR-77"])
    RailSubmission.objects.create(
        submission_id=uuid.uuid4(),
        payout_id=p.payout_id,
        account_id=acct.account_id,
        amount_minor=700,
        currency="EUR",
        presented_token=4242,
        owner_id="worker-7",
        idempotency_key=p.idempotency_key,
        request_hash="0" * 64,
        client_ref=str(p.payout_id),
        outcome="TIMEOUT",
        detail="read_timeout",
    )
    PayoutEvent.objects.create(
        payout_id=p.payout_id,
        from_state="SUBMITTING",
        to_state="RAIL_AMBIGUOUS",
        owner_id="sweep",
        at=dt.datetime(2026, 12, 1, 3, 0, 7, 123000, tzinfo=dt.UTC),
    )

    html = client.get(f"{QUARANTINE}/{p.payout_id}/change/").content.decode()

    assert "BOOKED_ONCE" in html and "RR-77" in html
    assert "4242" in html and "TIMEOUT" in html and "read_timeout" in html and "worker-7" in html
    assert "2026-12-01 03:00:07.123 UTC" in html
    assert f"{QUARANTINE}/{p.payout_id}/resolve/" in html
    assert 'name="_save"' not in html and 'name="_continue"' not in html


def test_posting_the_read_only_detail_page_changes_nothing_and_logs_nothing(client, staff):
    acct, p = quarantined("BOOKED_ONCE")
    response = client.post(f"{QUARANTINE}/{p.payout_id}/change/", {"state": "POSTED"})
    assert response.status_code in (400, 403)  # PermissionDenied (handler403's envelope)
    unchanged(p, acct)
    assert not LogEntry.objects.exists()


def test_the_admin_index_says_ledger_entries(client, staff):
    html = client.get("/admin/").content.decode()
    assert "Ledger entries" in html and "Ledger entrys" not in html


def test_a_stale_or_repeated_resolve_form_answers_with_an_admin_page_and_a_record(client, staff):
    from payments.models import OperatorRefusal

    acct, p = quarantined("NOT_BOOKED", [])
    first = resolve_page(client, p, resolution="FAILED", note="not on the statement")
    assert first.status_code == 302

    again = client.post(
        f"{QUARANTINE}/{p.payout_id}/resolve/",
        {"resolution": "FAILED", "note": "not on the statement"},
        follow=True,
    )
    reopened = client.get(f"{QUARANTINE}/{p.payout_id}/resolve/", follow=True)

    for page in (again, reopened):
        body = page.content.decode()
        assert page.status_code == 200 and page["Content-Type"].startswith("text/html")
        assert '"code"' not in body and "NOT_FOUND" not in body
        assert f"payout {p.payout_id} is FAILED: resolved FAILED by ops-carol at" in body
        assert page.redirect_chain[-1][0].endswith(f"/admin/payments/payout/{p.payout_id}/change/")
    assert (
        OperatorRefusal.objects.filter(object_id=str(p.payout_id), operator="ops-carol").count()
        == 2
    )
    assert (
        LogEntry.objects.filter(
            object_id=str(p.payout_id), change_message__startswith="refused: resolve (stale form)"
        ).count()
        == 2
    )
