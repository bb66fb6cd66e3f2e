"""The books close through the ops commands, over real paydb + raildb: rail recoveries recorded
from the reconciler's evidence, closed RECOVERED or WRITTEN_OFF, quarantined payouts resolved
only the safe way; every unsafe variant refused (exit 1, the reason), audited, and the rows
unchanged; the reconciler green exactly when the books agree with the statement."""

from __future__ import annotations

import json
import uuid
from io import StringIO

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import User
from django.contrib.contenttypes.models import ContentType
from django.core.management import CommandError, call_command
from django.db.models import F
from django.utils import timezone

from ops.reconciler import reconcile
from payments import seeding, selectors, services
from payments.fenced_sql import post as post_sql
from payments.models import (
    Account,
    LedgerEntry,
    OperatorRefusal,
    Payout,
    PayoutEvent,
    RailRecovery,
    RailRecoveryEvent,
    SettlementBucket,
)
from railproxy.models import RailSubmission
from railstub.models import RailTransfer

pytestmark = pytest.mark.django_db(databases=["default", "raildb"])

OPERATOR = "ops-books"


@pytest.fixture(autouse=True)
def staff():
    return User.objects.create_user(OPERATOR, password="x-long-password-1", is_staff=True)


def _account(balance: int = 10_000) -> Account:
    return seeding.create_account(
        account_id=f"acct-{uuid.uuid4().hex[:12]}", opening_balance_minor=balance
    )


def _quarantined(account: Account, amount: int = 1_000) -> Payout:
    payout = seeding.create_payout(account_id=account.account_id, amount_minor=amount)
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
        outcome="TIMEOUT",
    )
    Payout.objects.filter(pk=payout.pk).update(state="RAIL_AMBIGUOUS")
    PayoutEvent.objects.create(
        payout=payout, from_state="SUBMITTING", to_state="RAIL_AMBIGUOUS", owner_id="exec-test"
    )
    payout.refresh_from_db()
    return payout


def _booked(payout: Payout) -> str:
    reference = f"rail-{uuid.uuid4().hex[:12]}"
    RailTransfer.objects.using("raildb").create(
        rail_reference=reference,
        client_ref=str(payout.payout_id),
        amount_minor=payout.amount_minor,
        currency=payout.currency,
        accepted_at=timezone.now(),
    )
    return reference


def _acked_submission(payout: Payout, ref: str) -> uuid.UUID:
    """The rail proxy's ACKED submission of `payout`, with the rail's reference; its id."""
    submission_id = uuid.uuid4()
    RailSubmission.objects.create(
        submission_id=submission_id,
        payout_id=payout.payout_id,
        account_id=payout.account_id,
        amount_minor=payout.amount_minor,
        currency=payout.currency,
        presented_token=7,
        owner_id="exec-test",
        idempotency_key=payout.idempotency_key,
        request_hash="h",
        client_ref=str(payout.payout_id),
        outcome="ACKED",
        rail_reference=ref,
    )
    return submission_id


def _posted_with_duplicate(account: Account) -> tuple[Payout, str, str]:
    """A payout the executor POSTED from its ACKED submission while the rail booked it twice."""
    payout = seeding.create_payout(account_id=account.account_id, amount_minor=1_000)
    ref, dup = _booked(payout), _booked(payout)
    _acked_submission(payout, ref)
    settlement = Account.objects.get_or_create(
        account_id="settlement:EUR", defaults={"currency": "EUR", "kind": "SETTLEMENT"}
    )[0]
    for acct, direction, sign in ((account, "DEBIT", -1), (settlement, "CREDIT", 1)):
        LedgerEntry.objects.create(
            payout=payout, account=acct, direction=direction, amount_minor=1_000, fence=7
        )
        Account.objects.filter(pk=acct.pk).update(balance_minor=F("balance_minor") + sign * 1_000)
    Payout.objects.filter(pk=payout.pk).update(state="POSTED", rail_reference=ref)
    return payout, ref, dup


def _posted_by_p3_with_duplicate(account: Account) -> tuple[Payout, str, str]:
    """As `_posted_with_duplicate`, but through P2 and P3 themselves: the settlement credit
    lands in the payout's settlement bucket, not on the account row."""
    payout = seeding.create_payout(account_id=account.account_id, amount_minor=1_000)
    ref, dup = _booked(payout), _booked(payout)
    services.claim_payout(
        payout_id=payout.payout_id,
        token=7,
        owner_id="exec-test",
        idempotency_key=payout.idempotency_key,
        expected_state="PENDING",
    )
    submission_id = _acked_submission(payout, ref)
    Payout.objects.filter(pk=payout.pk).update(state="RAIL_ACKED")
    services.post_payout(
        payout_id=payout.payout_id,
        token=7,
        owner_id="exec-test",
        idempotency_key=payout.idempotency_key,
        rail_reference=ref,
        submission_id=submission_id,
    )
    return payout, ref, dup


def run(*args: str) -> dict:
    """The command's --json answer; CommandError (exit 1) propagates."""
    from io import StringIO

    out = StringIO()
    call_command(*args, "--operator", OPERATOR, "--json", stdout=out)
    return json.loads(out.getvalue())


def refused(*args: str) -> str:
    with pytest.raises(CommandError) as caught:
        run(*args)
    assert caught.value.returncode == 1
    return str(caught.value)


def bad_input(*args: str) -> str:
    """Exit 2: the input broke a flag's rules or named nothing; nothing recorded."""
    before = OperatorRefusal.objects.count()
    with pytest.raises(CommandError) as caught:
        run(*args)
    assert caught.value.returncode == 2
    assert OperatorRefusal.objects.count() == before
    return str(caught.value)


def balance(account_id: str) -> int:
    """As every reader sees it: a settlement account's row plus its buckets."""
    return selectors.get_account(account_id=account_id)["balanceMinor"]


def log_messages(model, object_id: str) -> list[str]:
    return list(
        LogEntry.objects.filter(
            content_type=ContentType.objects.get_for_model(model), object_id=object_id
        )
        .order_by("id")
        .values_list("change_message", flat=True)
    )


def test_a_duplicate_ack_keeps_reconcile_red_until_recorded_then_closes_recovered():
    payout, ref, dup = _posted_with_duplicate(_account())
    assert not reconcile().ok  # an unrecorded duplicate

    step = run("record_rail_recovery", "--transfer", dup, "--reason", "rail duplicate ack")

    assert step["status"] == "OPEN" and step["payoutId"] == str(payout.payout_id)
    assert balance("recoverable:rail:EUR") == -1_000
    assert balance("settlement:EUR") == 2_000  # both transfers that left
    report = reconcile()
    assert report.ok, report.violations
    assert report.recoveries["OPEN"] == 1

    closed = run("close_rail_recovery", "--transfer", dup, "--recovered", "--reference", "ret-1")

    assert closed["status"] == "RECOVERED"
    assert balance("recoverable:rail:EUR") == 0 and balance("settlement:EUR") == 1_000
    assert reconcile().ok
    recovery = RailRecovery.objects.get(rail_reference=dup)
    assert (recovery.status, recovery.close_reference, recovery.closed_by) == (
        "RECOVERED",
        "ret-1",
        OPERATOR,
    )
    assert [e.action for e in RailRecoveryEvent.objects.filter(recovery=recovery)] == [
        "RECORDED",
        "RECOVERED",
    ]
    assert len(log_messages(RailRecovery, str(recovery.recovery_id))) == 2
    assert any("closed RECOVERED" in m for m in log_messages(Payout, str(payout.payout_id)))

    assert "already RECOVERED" in refused(
        "close_rail_recovery", "--transfer", dup, "--written-off", "--reason", "second close"
    )
    assert RailRecovery.objects.get(rail_reference=dup).status == "RECOVERED"


def test_a_recovery_of_a_payout_posted_into_a_bucket_keeps_settlement_equal_to_its_ledger(
    settings,
):
    settings.PAY_SETTLEMENT_BUCKETS = 8
    payout, _, dup = _posted_by_p3_with_duplicate(_account())
    bucket = post_sql.settlement_bucket(payout.payout_id, buckets=8)
    assert list(
        SettlementBucket.objects.filter(account_id="settlement:EUR").values_list(
            "bucket", "balance_minor"
        )
    ) == [(bucket, 1_000)]
    assert not reconcile().ok  # the unrecorded duplicate, nothing else

    run("record_rail_recovery", "--transfer", dup, "--reason", "rail duplicate ack")

    books = selectors.get_account(account_id="settlement:EUR")
    assert books["balanceMinor"] == books["ledgerSumMinor"] == 2_000
    report = reconcile()
    assert report.ok, report.violations

    run("close_rail_recovery", "--transfer", dup, "--recovered", "--reference", "ret-2")

    books = selectors.get_account(account_id="settlement:EUR")
    assert books["balanceMinor"] == books["ledgerSumMinor"] == 1_000
    # The operator's legs moved the account row (+1 000 recorded, −1 000 recovered); P3's
    # credit stays in its bucket.
    assert Account.objects.get(account_id="settlement:EUR").balance_minor == 0
    assert SettlementBucket.objects.get(account_id="settlement:EUR").balance_minor == 1_000
    report = reconcile()
    assert report.ok, report.violations


def test_unsafe_recoveries_are_refused_audited_and_book_nothing():
    payout, ref, dup = _posted_with_duplicate(_account())
    reconcile()
    entries = LedgerEntry.objects.count()

    assert "not on the rail's statement" in refused(
        "record_rail_recovery", "--transfer", "rail-nosuch", "--reason", "made up reference"
    )
    assert "the one payout" in refused(
        "record_rail_recovery", "--transfer", ref, "--reason", "the payout's own transfer"
    )
    assert "at least 8" in bad_input("record_rail_recovery", "--transfer", dup, "--reason", "dup")
    run("record_rail_recovery", "--transfer", dup, "--reason", "rail duplicate ack")
    assert "already has a recovery" in refused(
        "record_rail_recovery", "--transfer", dup, "--reason", "the same one again"
    )
    assert "no rail recovery" in bad_input(
        "close_rail_recovery", "--transfer", ref, "--recovered", "--reference", "r"
    )
    assert "needs the rail's reference" in bad_input(
        "close_rail_recovery", "--transfer", dup, "--recovered"
    )

    assert LedgerEntry.objects.count() == entries + 2  # the one recorded recovery's legs
    assert RailRecovery.objects.count() == 1
    assert len([m for m in log_messages(RailRecovery, "rail-nosuch") if "refused" in m]) == 1
    refusals = [m for m in log_messages(Payout, str(payout.payout_id)) if "refused" in m]
    assert len(refusals) == 2  # own transfer, the second recovery (bad input is no refusal)


def test_written_off_moves_the_receivable_to_the_loss_account():
    _, _, dup = _posted_with_duplicate(_account())
    reconcile()
    run("record_rail_recovery", "--transfer", dup, "--reason", "rail duplicate ack")

    assert "at least 8" in bad_input(
        "close_rail_recovery", "--transfer", dup, "--written-off", "--reason", "no"
    )
    closed = run(
        "close_rail_recovery", "--transfer", dup, "--written-off", "--reason", "beneficiary gone"
    )

    assert closed["status"] == "WRITTEN_OFF"
    assert balance("loss:rail:EUR") == -1_000 and balance("recoverable:rail:EUR") == 0
    assert balance("settlement:EUR") == 2_000
    assert reconcile().ok


def test_a_booked_once_payout_resolved_posted_with_the_statement_reference_passes():
    account = _account()
    payout = _quarantined(account)
    ref = _booked(payout)
    reconcile()

    done = run(
        "resolve_payout",
        str(payout.payout_id),
        "--to",
        "POSTED",
        "--reference",
        ref,
        "--note",
        "statement shows it booked once",
    )

    assert done["toState"] == "POSTED" and done["reference"] == ref
    report = reconcile()
    assert report.ok, report.violations  # finding 2
    assert any(
        "resolved RAIL_AMBIGUOUS → POSTED" in m for m in log_messages(Payout, done["payoutId"])
    )


def test_unsafe_resolutions_are_refused_and_audited_on_the_payout():
    account = _account()
    not_booked = _quarantined(account)
    once = _quarantined(account)
    once_ref = _booked(once)
    reconcile()

    assert "needs classification BOOKED_ONCE" in refused(
        "resolve_payout", str(not_booked.payout_id), "--to", "POSTED", "--note", "looks paid"
    )
    assert "record each as a rail recovery first" in refused(
        "resolve_payout", str(once.payout_id), "--to", "FAILED", "--note", "customer cancelled"
    )
    assert "not the one on the rail's statement" in refused(
        "resolve_payout",
        str(once.payout_id),
        "--to",
        "POSTED",
        "--reference",
        "rail-other",
        "--note",
        "wrong reference",
    )

    assert Payout.objects.get(pk=not_booked.pk).state == "RAIL_AMBIGUOUS"
    assert Payout.objects.get(pk=once.pk).state == "RAIL_AMBIGUOUS"
    assert not LedgerEntry.objects.filter(payout__in=[not_booked, once]).exists()
    assert any("refused: resolve as POSTED" in m for m in log_messages(Payout, str(not_booked.pk)))
    assert len([m for m in log_messages(Payout, str(once.pk)) if "refused" in m]) == 2

    # FAILED on BOOKED_ONCE becomes safe once the transfer is a recorded recovery.
    run("record_rail_recovery", "--transfer", once_ref, "--reason", "beneficiary rejected it")
    run("resolve_payout", str(once.payout_id), "--to", "FAILED", "--note", "recovering it")
    run("resolve_payout", str(not_booked.payout_id), "--to", "FAILED", "--note", "not booked")
    report = reconcile()
    assert report.ok, report.violations


def test_an_override_to_failed_on_a_booked_payout_keeps_reconcile_red_until_recorded():
    account = _account()
    once = _quarantined(account)
    ref = _booked(once)
    reconcile()

    run(
        "resolve_payout",
        str(once.payout_id),
        "--to",
        "FAILED",
        "--override",
        "--note",
        "operator insists the beneficiary never got it",
    )

    report = reconcile()
    assert [v["payoutId"] for v in report.violations["failed_has_no_booked_transfer"]] == [
        str(once.payout_id)
    ]
    run("record_rail_recovery", "--transfer", ref, "--reason", "money left for a FAILED payout")
    assert reconcile().ok


def test_a_booked_multiple_payout_resolves_posted_once_its_duplicate_is_recorded():
    account = _account()
    payout = _quarantined(account)
    first, second = sorted([_booked(payout), _booked(payout)])
    reconcile()

    assert "exactly one booked transfer" in refused(
        "resolve_payout",
        str(payout.payout_id),
        "--to",
        "POSTED",
        "--reference",
        first,
        "--note",
        "pick one",
    )
    run("record_rail_recovery", "--transfer", second, "--reason", "rail duplicate ack")
    done = run("resolve_payout", str(payout.payout_id), "--to", "POSTED", "--note", "one left")

    assert done["reference"] == first  # the one transfer no recovery accounts for
    assert reconcile().ok


def test_a_command_without_a_staff_operator_is_refused():
    with pytest.raises(CommandError) as caught:
        call_command(
            "record_rail_recovery",
            "--transfer",
            "x",
            "--reason",
            "whatever it is",
            "--operator",
            "nobody-here",
        )
    assert caught.value.returncode == 1 and "no active staff user" in str(caught.value)


def test_without_operator_an_os_user_with_no_staff_account_is_refused_recorded_and_not_created():
    """docs/operations.md: the default operator is the OS user's own staff account; none is
    ever created on the fly, and the refusal is recorded (no user to hang a LogEntry on)."""
    from io import StringIO

    from django.contrib.auth import get_user_model

    from ops.books import os_user
    from payments.models import OperatorRefusal

    users = get_user_model().objects.count()
    out = StringIO()
    with pytest.raises(CommandError) as caught:
        call_command(
            "record_rail_recovery",
            "--transfer",
            "absent-ref",
            "--reason",
            "duplicate ack",
            "--json",
            stdout=out,
        )
    assert caught.value.returncode == 1 and "no active staff user" in str(caught.value)
    assert get_user_model().objects.count() == users
    (refusal,) = OperatorRefusal.objects.filter(operator=os_user() or "-")
    assert (refusal.known_user, refusal.action, refusal.object_type) == (
        False,
        "record_rail_recovery",
        "operator",
    )


def test_an_unknown_operator_is_refused_with_a_record():
    from payments.models import OperatorRefusal

    with pytest.raises(CommandError) as caught:
        call_command(
            "resolve_payout",
            str(uuid.uuid4()),
            "--to",
            "FAILED",
            "--note",
            "n",
            "--operator",
            "mallory",
        )
    assert caught.value.returncode == 1
    assert OperatorRefusal.objects.filter(operator="mallory", known_user=False).count() == 1


def test_a_metrics_file_that_is_not_a_regular_file_is_written_never_replaced(tmp_path):
    """`--metrics-file /dev/null` must not turn the device into a file (a FIFO stands in)."""
    import os
    import stat
    import threading

    fifo = tmp_path / "metrics.fifo"
    os.mkfifo(fifo)
    received: list[str] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_text()), daemon=True)
    reader.start()

    call_command("reconcile", "--json", "--metrics-file", str(fifo), stdout=open(os.devnull, "w"))

    reader.join(10)
    assert stat.S_ISFIFO(fifo.stat().st_mode)
    assert "reconcile_ok" in received[0]


def test_a_finding_names_the_own_reference_the_duplicates_in_order_and_the_next_commands():
    payout = _quarantined(_account())
    own, dup1, dup2 = _booked(payout), _booked(payout), _booked(payout)  # accepted in this order

    found = reconcile().as_dict()["payouts"][str(payout.payout_id)]

    assert found["classification"] == "BOOKED_MULTIPLE"
    assert found["ownReference"] == own and found["needsRecovery"] == [dup1, dup2]
    steps = found["nextSteps"]
    assert [s.split("--transfer ")[1].split()[0] for s in steps[:2]] == [dup1, dup2]
    assert steps[-1].startswith(f"ROLE=ops manage.py resolve_payout {payout.payout_id} --to POSTED")
    assert f"--reference {own}" in steps[-1]
    from io import StringIO

    text = StringIO()
    call_command("reconcile", "--metrics-file", "/dev/null", stdout=text)
    assert f"own reference (the payout's transfer): {own}" in text.getvalue()
    assert f"needs a rail recovery #2: {dup2}" in text.getvalue()
    assert "--all-from-reconcile --dry-run" in text.getvalue()


def test_a_bad_rail_day_closes_from_a_reviewed_plan_without_a_loop():
    account = _account(100_000)
    posted = [_posted_with_duplicate(account) for _ in range(3)]  # 3 duplicate acks
    quarantined = _quarantined(account)
    q_own, q_dup = _booked(quarantined), _booked(quarantined)

    planned = run("record_rail_recovery", "--all-from-reconcile", "--dry-run")

    assert planned["dryRun"] is True
    assert sorted(r["railReference"] for r in planned["plan"]) == sorted(
        [dup for _, _, dup in posted] + [q_dup]
    )
    assert not RailRecovery.objects.exists()

    applied = run(
        "record_rail_recovery", "--all-from-reconcile", "--reason", "rail duplicate acks 12-04"
    )

    assert applied["ok"] and all(r["recorded"] for r in applied["results"])
    assert RailRecovery.objects.count() == 4
    for payout, _, dup in posted:  # audited per transfer, on each payout
        assert any(dup in m for m in log_messages(Payout, str(payout.payout_id)))
    run("resolve_payout", str(quarantined.payout_id), "--to", "POSTED", "--note", "own one left")
    assert Payout.objects.get(pk=quarantined.pk).rail_reference == q_own
    assert reconcile().ok


def test_list_rail_recoveries_shows_open_first_with_their_age():
    from io import StringIO

    account = _account()
    (_, _, first), (_, _, second) = _posted_with_duplicate(account), _posted_with_duplicate(account)
    reconcile()
    run("record_rail_recovery", "--transfer", first, "--reason", "rail duplicate ack")
    run("record_rail_recovery", "--transfer", second, "--reason", "rail duplicate ack")
    run("close_rail_recovery", "--transfer", first, "--written-off", "--reason", "claim refused")

    out = StringIO()
    call_command("list_rail_recoveries", "--json", stdout=out)
    listed = json.loads(out.getvalue())["recoveries"]

    assert [(r["railReference"], r["status"]) for r in listed] == [
        (second, "OPEN"),
        (first, "WRITTEN_OFF"),
    ]
    assert all(r["ageSeconds"] >= 0 for r in listed)
    text = StringIO()
    call_command("list_rail_recoveries", stdout=text)
    assert text.getvalue().splitlines()[0] == "2 rail recoveries, 1 OPEN"
    assert "close_rail_recovery --transfer REF" in text.getvalue()


def test_exit_zero_reports_broken_books_as_the_verdict_row_not_the_exit_code():
    """The CronJob's mode: a verdict never fails the Job; reconcile_ok carries it."""
    import os

    from payments.models import ReconcileRun

    _posted_with_duplicate(_account())  # an unrecorded duplicate: broken books

    call_command(
        "reconcile", "--exit-zero", "--metrics-file", os.devnull, stdout=open(os.devnull, "w")
    )

    assert ReconcileRun.objects.order_by("-run_id").first().ok is False
    with pytest.raises(SystemExit) as caught:
        call_command("reconcile", "--metrics-file", os.devnull, stdout=open(os.devnull, "w"))
    assert caught.value.code == 1


def _recorded_duplicates(n: int) -> list[str]:
    account = _account(100_000)
    dups = [_posted_with_duplicate(account)[2] for _ in range(n)]
    reconcile()
    run("record_rail_recovery", "--all-from-reconcile", "--reason", "rail duplicate acks 12-04")
    return dups


def test_a_bad_rail_day_closes_its_recoveries_from_a_reviewed_plan_file(tmp_path):
    dups = _recorded_duplicates(3)
    plan = tmp_path / "plan.txt"
    plan.write_text(
        "# rail returns of 12-05, ticket 4411\n"
        f"{dups[0]} RECOVERED RET-0 came back on the 12-05 statement\n"
        "\n"
        f"{dups[1]}   RECOVERED   RET-1\n"
        f"{dups[2]} WRITTEN_OFF beneficiary bank closed the account\n"
    )

    planned = run("close_rail_recovery", "--all-from-file", str(plan), "--dry-run")

    assert planned["dryRun"] is True
    assert [(r["railReference"], r["outcome"], r["status"]) for r in planned["plan"]] == [
        (dups[0], "RECOVERED", "OPEN"),
        (dups[1], "RECOVERED", "OPEN"),
        (dups[2], "WRITTEN_OFF", "OPEN"),
    ]
    assert set(RailRecovery.objects.values_list("status", flat=True)) == {"OPEN"}

    applied = run("close_rail_recovery", "--all-from-file", str(plan))

    assert applied["ok"] and [r["status"] for r in applied["results"]] == [
        "RECOVERED",
        "RECOVERED",
        "WRITTEN_OFF",
    ]
    rows = {r.rail_reference: r for r in RailRecovery.objects.filter(rail_reference__in=dups)}
    assert (rows[dups[0]].close_reference, rows[dups[0]].closed_by) == ("RET-0", OPERATOR)
    assert rows[dups[1]].close_reference == "RET-1"
    assert rows[dups[2]].close_reason == "beneficiary bank closed the account"
    for dup in dups:  # each step audited: its event row and its History on the recovery
        assert RailRecoveryEvent.objects.filter(recovery=rows[dup]).count() == 2
        assert any("closed" in m for m in log_messages(RailRecovery, str(rows[dup].pk)))
    assert balance("loss:rail:EUR") == -1_000 and balance("recoverable:rail:EUR") == 0
    assert reconcile().ok


def test_a_plan_step_closed_already_is_refused_and_recorded_and_the_rest_go_on(tmp_path):
    dups = _recorded_duplicates(2)
    run("close_rail_recovery", "--transfer", dups[0], "--recovered", "--reference", "RET-A")
    plan = tmp_path / "plan.txt"
    plan.write_text(f"{dups[0]} RECOVERED RET-A\n{dups[1]} RECOVERED RET-B\n")

    planned = run("close_rail_recovery", "--all-from-file", str(plan), "--dry-run")
    assert [r["status"] for r in planned["plan"]] == ["RECOVERED", "OPEN"]
    out = StringIO()
    with pytest.raises(CommandError) as caught:
        call_command(
            "close_rail_recovery", "--all-from-file", str(plan), "--operator", OPERATOR, stdout=out
        )

    assert caught.value.returncode == 1
    assert "closed 1 of 2 rail recoveries" in out.getvalue()
    assert f"{dups[0]}: refused: the recovery of transfer {dups[0]} is already RECOVERED" in (
        out.getvalue()
    )
    assert RailRecovery.objects.get(rail_reference=dups[1]).status == "RECOVERED"
    assert OperatorRefusal.objects.filter(action=f"close rail recovery {dups[0]}").count() == 1


@pytest.mark.parametrize(
    ("plan", "why"),
    [
        ("RR-1 RECOVERED\n", ":1: expected"),
        ("RR-1 CLOSED RET-1\n", ":1: expected"),
        ("RR-1 RECOVERED RET-1\nRR-1 RECOVERED RET-2\n", "already planned on line 1"),
        ("RR-1 WRITTEN_OFF gone\n", "at least 8 characters"),
        ("# nothing\n\n", "no recovery to close"),
    ],
)
def test_a_bad_plan_file_is_exit_2_and_closes_nothing(tmp_path, plan, why):
    path = tmp_path / "plan.txt"
    path.write_text(plan)
    assert why in bad_input("close_rail_recovery", "--all-from-file", str(path))


def test_a_plan_naming_a_transfer_with_no_recovery_closes_nothing(tmp_path):
    (dup,) = _recorded_duplicates(1)
    path = tmp_path / "plan.txt"
    path.write_text(f"{dup} RECOVERED RET-1\nrail-nowhere RECOVERED RET-2\n")

    said = bad_input("close_rail_recovery", "--all-from-file", str(path))
    assert f"{path}:2: no rail recovery for transfer 'rail-nowhere'" in said  # PLAN:line
    assert RailRecovery.objects.get(rail_reference=dup).status == "OPEN"


def test_a_plan_with_single_close_flags_is_a_bad_argument(tmp_path):
    path = tmp_path / "plan.txt"
    path.write_text("RR-1 RECOVERED RET-1\n")
    assert "takes each outcome from its PLAN" in bad_input(
        "close_rail_recovery", "--all-from-file", str(path), "--recovered"
    )


def test_each_money_actions_refusal_is_recorded_logged_and_evented_once(caplog):
    """One pipeline: whichever action is refused, exactly one operator_refusal row, one
    "refused: …" LogEntry and one WARNING *_refused event, and nothing else written."""
    import logging

    account = _account()
    posted, ref, dup = _posted_with_duplicate(account)
    pending = seeding.create_payout(account_id=account.account_id, amount_minor=500)
    reconcile()
    run("record_rail_recovery", "--transfer", dup, "--reason", "rail duplicate ack")
    run("close_rail_recovery", "--transfer", dup, "--recovered", "--reference", "RET-1")
    cases = [
        (("resolve_payout", str(pending.payout_id), "--to", "FAILED", "--note", "looked"),
         "payout_resolution_refused", str(pending.payout_id)),
        (("record_rail_recovery", "--transfer", dup, "--reason", "the same one again"),
         "rail_recovery_refused", str(posted.payout_id)),
        (("close_rail_recovery", "--transfer", dup, "--recovered", "--reference", "RET-2"),
         "rail_recovery_refused", str(posted.payout_id)),
        (("reverse_payout", str(pending.payout_id), "--reason", "not on the statement"),
         "payout_reversal_refused", str(pending.payout_id)),
    ]  # fmt: skip
    for args, event, payout_id in cases:
        rows, entries, ledger = (
            OperatorRefusal.objects.count(),
            LogEntry.objects.count(),
            LedgerEntry.objects.count(),
        )
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="dlock.events"):
            refused(*args)
        assert OperatorRefusal.objects.count() == rows + 1, args
        assert LogEntry.objects.count() == entries + 1, args
        (entry,) = LogEntry.objects.order_by("-id")[:1]
        assert entry.object_id == payout_id and entry.change_message.startswith("refused: ")
        logged = [r for r in caplog.records if getattr(r, "event", None)]
        assert [(r.event, r.levelno) for r in logged] == [(event, logging.WARNING)], args
        assert LedgerEntry.objects.count() == ledger
