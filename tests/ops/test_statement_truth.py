"""The rail's statement is the truth (ARCHITECTURE decision 20): no override posts a payout
against a reference the statement lacks, and a POSTED payout the statement contradicts has a
guarded, audited way back (a ledger reversal, never an edit) that leaves the books green."""

from __future__ import annotations

from io import StringIO

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.db.models import Sum
from django.utils import timezone

from ops.reconciler import reconcile
from payments import services
from payments.models import (
    Account,
    LedgerEntry,
    OperatorRefusal,
    Payout,
    PayoutEvent,
    PayoutReversal,
)
from payments.resolve import resolve_payout
from tests.ops.test_books_commands import OPERATOR, _account, _booked, _quarantined, run

pytestmark = pytest.mark.django_db(databases=["default", "raildb"])

NOT_ON_STATEMENT = "RR-NOT-ON-STATEMENT-1"


@pytest.fixture(autouse=True)
def staff():
    return User.objects.create_user(OPERATOR, password="x-long-password-1", is_staff=True)


def refused_with(*args: str) -> str:
    with pytest.raises(CommandError) as caught:
        run(*args)
    assert caught.value.returncode == 1
    return str(caught.value)


def reconcile_exit() -> int:
    try:
        call_command("reconcile", "--metrics-file", "/dev/null", stdout=StringIO())
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


def balances_sum() -> int:
    return int(Account.objects.aggregate(s=Sum("balance_minor"))["s"] or 0) + sum(
        b.balance_minor
        for a in Account.objects.prefetch_related("buckets")
        for b in a.buckets.all()
    )


def test_the_issue_sequence_an_override_to_posted_off_the_statement_is_refused_and_books_close():
    account = _account()
    payout = _quarantined(account)
    assert reconcile_exit() == 0  # NOT_BOOKED in quarantine: classified, not broken

    reason = refused_with(
        "resolve_payout",
        str(payout.payout_id),
        "--to",
        "POSTED",
        "--reference",
        NOT_ON_STATEMENT,
        "--override",
        "--note",
        "the beneficiary's bank says it arrived",
    )

    assert f"{NOT_ON_STATEMENT!r} is not on the rail's statement" in reason
    payout.refresh_from_db()
    assert payout.state == "RAIL_AMBIGUOUS" and payout.rail_reference is None
    assert not LedgerEntry.objects.filter(payout=payout).exists()
    assert OperatorRefusal.objects.filter(
        object_id=str(payout.payout_id), operator=OPERATOR, known_user=True
    ).exists()
    assert LogEntry.objects.filter(
        object_id=str(payout.payout_id), change_message__contains="refused: resolve as POSTED"
    ).exists()

    run("resolve_payout", str(payout.payout_id), "--to", "FAILED", "--note", "never left")
    assert reconcile_exit() == 0
    assert balances_sum() == 0


def test_an_override_naming_another_payouts_transfer_is_refused():
    account = _account()
    mine, other = _quarantined(account), _quarantined(account)
    theirs = _booked(other)
    reconcile()

    reason = refused_with(
        "resolve_payout",
        str(mine.payout_id),
        "--to",
        "POSTED",
        "--reference",
        theirs,
        "--override",
        "--note",
        "operator insists this one is ours",
    )

    assert f"a transfer for {other.payout_id}, not for this payout" in reason
    assert Payout.objects.get(pk=mine.pk).state == "RAIL_AMBIGUOUS"


def test_the_admin_path_checks_the_reconcilers_reading_of_the_statement(staff):
    payout = _quarantined(_account())
    reconcile()

    from dlock.errors import ApiError

    with pytest.raises(ApiError) as caught:
        resolve_payout(
            payout_id=payout.payout_id,
            resolution="POSTED",
            user=staff,
            note="admin override with a made-up reference",
            rail_reference=NOT_ON_STATEMENT,
            override=True,
        )
    assert "not on the rail's statement" in caught.value.details["reason"]
    assert Payout.objects.get(pk=payout.pk).state == "RAIL_AMBIGUOUS"


def _posted_off_statement(account: Account) -> Payout:
    """A payout POSTED with a reference the statement lacks: what an override could do before
    the statement guard (the service itself, below the guard)."""
    payout = _quarantined(account)
    services.resolve_quarantined(
        payout_id=payout.payout_id,
        resolution="POSTED",
        operator=OPERATOR,
        note="legacy override",
        rail_reference=NOT_ON_STATEMENT,
    )
    payout.refresh_from_db()
    return payout


def test_a_posted_payout_the_statement_contradicts_is_reversed_and_the_books_close():
    account = _account(balance=10_000)
    payout = _posted_off_statement(account)
    posted_legs = list(
        LedgerEntry.objects.filter(payout=payout).values_list("entry_id", "amount_minor")
    )
    assert Account.objects.get(pk=account.pk).balance_minor == 9_000

    # No evidence yet: the reconciler has not looked since it was POSTED.
    assert "no finding for this payout since it was POSTED" in refused_with(
        "reverse_payout", str(payout.payout_id), "--reason", "not on the statement"
    )
    assert reconcile_exit() == 1
    text = StringIO()
    with pytest.raises(SystemExit):
        call_command("reconcile", "--metrics-file", "/dev/null", stdout=text)
    assert f"reverse_payout {payout.payout_id}" in text.getvalue()  # the next step, printed

    done = run("reverse_payout", str(payout.payout_id), "--reason", "RR-1 not on the statement")

    assert (done["fromState"], done["toState"], done["railReference"]) == (
        "POSTED",
        "FAILED",
        NOT_ON_STATEMENT,
    )
    payout.refresh_from_db()
    assert payout.state == "FAILED"
    assert Account.objects.get(pk=account.pk).balance_minor == 10_000
    # The posting's legs are untouched; the reversal's are new rows owned by its record.
    assert (
        list(LedgerEntry.objects.filter(payout=payout).values_list("entry_id", "amount_minor"))
        == posted_legs
    )
    reversal = PayoutReversal.objects.get(payout=payout)
    assert sorted(
        LedgerEntry.objects.filter(reversal=reversal).values_list("account_id", "direction")
    ) == [(account.account_id, "CREDIT"), ("settlement:EUR", "DEBIT")]
    assert PayoutEvent.objects.filter(
        payout=payout, from_state="POSTED", to_state="FAILED"
    ).exists()
    assert LogEntry.objects.filter(
        object_id=str(payout.payout_id), change_message__startswith="reversed POSTED → FAILED"
    ).exists()
    assert reconcile_exit() == 0
    assert balances_sum() == 0

    assert "only a POSTED payout is reversed" in refused_with(
        "reverse_payout", str(payout.payout_id), "--reason", "reverse it twice"
    )


def test_a_posted_payout_whose_reference_is_on_the_statement_is_never_reversed():
    account = _account()
    payout = _quarantined(account)
    ref = _booked(payout)
    reconcile()
    run("resolve_payout", str(payout.payout_id), "--to", "POSTED", "--note", "booked once")
    reconcile()

    assert "no finding for this payout" in refused_with(
        "reverse_payout", str(payout.payout_id), "--reason", "try to undo real money"
    )
    # Even with a stale finding that lacked it, the statement read now still has it.
    from payments.models import PayoutReconciliation

    PayoutReconciliation.objects.update_or_create(
        payout_id=payout.payout_id,
        defaults={
            "classification": "NOT_BOOKED",
            "rail_transfer_count": 0,
            "rail_references": [],
            "rail_transfers": [],
            "checked_at": timezone.now(),
        },
    )
    assert f"has reference {ref} for this payout" in refused_with(
        "reverse_payout", str(payout.payout_id), "--reason", "try to undo real money"
    )
    assert Payout.objects.get(pk=payout.pk).state == "POSTED"
    assert not PayoutReversal.objects.exists()
    assert OperatorRefusal.objects.filter(object_id=str(payout.payout_id)).count() == 2


def test_a_payout_id_that_is_no_uuid_is_a_bad_argument_not_a_refusal():
    with pytest.raises(CommandError) as caught:
        call_command("reverse_payout", "not-a-uuid", "--reason", "whatever it is")
    assert caught.value.returncode == 2
    assert not OperatorRefusal.objects.exists()
