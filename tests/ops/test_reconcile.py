"""The reconciler over real paydb + raildb: classifies, checks invariants, never repairs."""

from __future__ import annotations

import json
import os
import uuid

import pytest
from django.core.management import call_command
from django.db.models import F
from django.utils import timezone

from devstack.common import free_port
from devstack.roles import manage
from ops.reconciler import reconcile
from ops.report import metrics_text, render_text
from payments import seeding, services
from payments.models import (
    Account,
    LedgerEntry,
    Payout,
    PayoutReconciliation,
    SettlementBucket,
)
from railproxy.models import RailSubmission
from railstub.models import RailTransfer

pytestmark = pytest.mark.django_db(databases=["default", "raildb"])


def _account(balance: int = 10_000) -> Account:
    return seeding.create_account(
        account_id=f"acct-{uuid.uuid4().hex[:12]}", opening_balance_minor=balance
    )


def _payout(account: Account, state: str, amount: int = 1_000) -> Payout:
    payout = seeding.create_payout(account_id=account.account_id, amount_minor=amount)
    Payout.objects.filter(payout_id=payout.payout_id).update(state=state)
    payout.refresh_from_db()
    return payout


def _submission(payout: Payout, outcome: str, rail_reference: str | None = None) -> None:
    RailSubmission.objects.create(
        submission_id=uuid.uuid4(),
        payout_id=payout.payout_id,
        account_id=payout.account_id,
        amount_minor=payout.amount_minor,
        currency=payout.currency,
        presented_token=7,
        owner_id="exec-test",
        idempotency_key=payout.idempotency_key,
        request_hash="h",
        client_ref=str(payout.payout_id),
        outcome=outcome,
        rail_reference=rail_reference,
    )


def _booked(client_ref: str, amount: int = 1_000) -> str:
    reference = f"rail-{uuid.uuid4().hex[:12]}"
    RailTransfer.objects.using("raildb").create(
        rail_reference=reference,
        client_ref=client_ref,
        amount_minor=amount,
        currency="EUR",
        accepted_at=timezone.now(),
    )
    return reference


def _post(payout: Payout) -> None:
    """Book the ledger legs as P3 would, keeping balance == ledger."""
    settlement = Account.objects.get_or_create(
        account_id="settlement:EUR", defaults={"currency": "EUR", "kind": "SETTLEMENT"}
    )[0]
    for account, direction, sign in (
        (payout.account, "DEBIT", -1),
        (settlement, "CREDIT", 1),
    ):
        LedgerEntry.objects.create(
            payout=payout,
            account=account,
            direction=direction,
            amount_minor=payout.amount_minor,
            fence=7,
        )
        Account.objects.filter(pk=account.pk).update(
            balance_minor=F("balance_minor") + sign * payout.amount_minor
        )
    Payout.objects.filter(pk=payout.pk).update(state="POSTED")


def test_in_flight_payouts_are_classified_by_what_the_rail_booked_and_findings_written():
    account = _account()
    not_booked = _payout(account, "RAIL_AMBIGUOUS")
    _submission(not_booked, "TIMEOUT")
    once = _payout(account, "RAIL_AMBIGUOUS")
    _submission(once, "TIMEOUT")
    once_ref = _booked(str(once.payout_id))
    twice = _payout(account, "SUBMITTING")
    _submission(twice, "PENDING")
    twice_refs = sorted([_booked(str(twice.payout_id)), _booked(str(twice.payout_id))])
    orphaned_state = _payout(account, "SUBMITTING")

    report = reconcile()

    found = report.classifications
    assert found[str(not_booked.payout_id)]["classification"] == "NOT_BOOKED"
    assert found[str(once.payout_id)]["classification"] == "BOOKED_ONCE"
    assert found[str(once.payout_id)]["railReferences"] == [once_ref]
    assert found[str(twice.payout_id)]["classification"] == "BOOKED_MULTIPLE"
    assert found[str(orphaned_state.payout_id)]["classification"] == "NO_SUBMISSION"
    row = PayoutReconciliation.objects.get(payout_id=twice.payout_id)
    assert row.classification == "BOOKED_MULTIPLE"
    assert row.rail_transfer_count == 2 and sorted(row.rail_references) == twice_refs
    assert PayoutReconciliation.objects.get(payout_id=once.payout_id).rail_transfer_count == 1
    # Detective only: nothing it read was changed.
    assert Payout.objects.get(pk=twice.pk).state == "SUBMITTING"
    assert Payout.objects.get(pk=not_booked.pk).state == "RAIL_AMBIGUOUS"


def test_consistent_books_pass_every_invariant():
    account = _account(5_000)
    posted = _payout(account, "RAIL_ACKED")
    ref = _booked(str(posted.payout_id))
    _submission(posted, "ACKED", ref)
    _post(posted)

    report = reconcile()

    mine = {
        name: [v for v in found if _mentions(v, posted, account)]
        for name, found in report.violations.items()
    }
    assert all(not found for found in mine.values()), mine
    assert Account.objects.get(pk=account.pk).balance_minor == 4_000


def _mentions(violation: dict, payout: Payout, account: Account) -> bool:
    text = json.dumps(violation)
    return str(payout.payout_id) in text or account.account_id in text


def test_a_balance_that_drifted_from_its_ledger_breaks_the_run():
    account = _account(5_000)
    Account.objects.filter(pk=account.pk).update(balance_minor=F("balance_minor") + 1)

    report = reconcile()

    assert not report.ok
    drift = [
        v
        for v in report.violations["balance_equals_ledger"]
        if v["accountId"] == account.account_id
    ]
    assert drift == [
        {"accountId": account.account_id, "balanceMinor": 5_001, "ledgerSumMinor": 5_000}
    ]
    assert Account.objects.get(pk=account.pk).balance_minor == 5_001  # never repaired


def test_balances_posted_into_settlement_buckets_pass_and_a_drifted_bucket_breaks_the_run(
    settings,
):
    settings.PAY_SETTLEMENT_BUCKETS = 8
    account = _account(20_000)
    posted = []
    for n in range(12):
        payout = _payout(account, "PENDING", amount=100 + n)
        token = 100 + n  # each claim a newer grant on the account
        services.claim_payout(
            payout_id=payout.payout_id,
            token=token,
            owner_id="exec-test",
            idempotency_key=payout.idempotency_key,
            expected_state="PENDING",
        )
        ref = _booked(str(payout.payout_id), amount=payout.amount_minor)
        _submission(payout, "ACKED", ref)
        Payout.objects.filter(pk=payout.pk).update(state="RAIL_ACKED")
        services.post_payout(
            payout_id=payout.payout_id,
            token=token,
            owner_id="exec-test",
            idempotency_key=payout.idempotency_key,
            rail_reference=ref,
            submission_id=RailSubmission.objects.get(payout_id=payout.payout_id).submission_id,
        )
        posted.append(payout)
    assert SettlementBucket.objects.filter(account_id="settlement:EUR").count() > 1

    report = reconcile()

    assert report.ok, report.violations  # the settlement balance is its row plus its buckets

    bucket = SettlementBucket.objects.filter(account_id="settlement:EUR").first()
    SettlementBucket.objects.filter(pk=bucket.pk).update(balance_minor=F("balance_minor") + 1)

    report = reconcile()

    total = sum(p.amount_minor for p in posted)
    assert report.violations["balance_equals_ledger"] == [
        {"accountId": "settlement:EUR", "balanceMinor": total + 1, "ledgerSumMinor": total}
    ]


def test_a_posted_payout_booked_twice_or_without_an_acked_submission_breaks_the_run():
    account = _account(5_000)
    doubled = _payout(account, "RAIL_ACKED")
    ref = _booked(str(doubled.payout_id))
    _booked(str(doubled.payout_id))
    _submission(doubled, "ACKED", ref)
    _post(doubled)
    unacked = _payout(account, "RAIL_ACKED")
    _booked(str(unacked.payout_id))
    _submission(unacked, "TIMEOUT")
    _post(unacked)

    report = reconcile()

    booked = {
        v["payoutId"]: v["bookedTransfers"]
        for v in report.violations["posted_has_one_booked_transfer"]
    }
    acked = {v["payoutId"] for v in report.violations["posted_has_one_acked_submission"]}
    assert booked[str(doubled.payout_id)] == 2
    assert str(unacked.payout_id) in acked and str(doubled.payout_id) not in acked
    assert report.classifications[str(doubled.payout_id)]["classification"] == "BOOKED_MULTIPLE"


def test_a_booked_transfer_without_a_submission_breaks_the_run_and_exits_1(tmp_path, capsys):
    stray = f"stray-{uuid.uuid4().hex[:8]}"
    reference = _booked(stray)
    metrics = tmp_path / "reconcile.prom"

    with pytest.raises(SystemExit) as exited:
        call_command("reconcile", "--json", "--metrics-file", str(metrics))

    assert exited.value.code == 1
    body = json.loads(capsys.readouterr().out)
    assert body["ok"] is False
    assert {"clientRef": stray, "railReference": reference} in body["violations"][
        "transfer_has_submission"
    ]
    text = metrics.read_text()
    assert "reconcile_ok 0.0" in text
    assert 'reconcile_violations{invariant="transfer_has_submission"}' in text


def test_the_readable_report_names_each_invariant_and_metrics_carry_no_ids():
    account = _account()
    ambiguous = _payout(account, "RAIL_AMBIGUOUS")
    _submission(ambiguous, "TIMEOUT")

    report = reconcile(write=False)
    text = render_text(report)

    for name in report.INVARIANTS:
        assert name in text
    assert str(ambiguous.payout_id) in text
    assert not PayoutReconciliation.objects.filter(payout_id=ambiguous.payout_id).exists()
    assert str(ambiguous.payout_id) not in metrics_text(report)


def test_unreadable_databases_exit_2_with_one_line_and_no_report(tmp_path):
    """ "Could not check" must look like neither "clean" (0) nor "broken" (1)."""

    dead = {
        name: f"postgres://postgres@127.0.0.1:{free_port()}/x"
        for name in ("PAY_DATABASE_URL", "LOCK_DATABASE_URL", "RAIL_DATABASE_URL")
    }
    metrics_file = tmp_path / "reconcile.prom"
    result = manage(
        ["reconcile", "--json", "--metrics-file", str(metrics_file)],
        {
            **dead,
            "DJANGO_SECRET_KEY": os.environ["DJANGO_SECRET_KEY"],
            "DB_QUEUE_DEADLINE_MS": "300",
        },
        role="ops",
        check=False,
        capture=True,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "could not read the databases" in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == "" and not metrics_file.exists()
