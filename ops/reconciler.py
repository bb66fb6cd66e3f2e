"""The reconciler: detective control over paydb and the rail's statement. It never repairs.

Reads (paydb in one REPEATABLE READ snapshot, then raildb — every transfer's intent row commits
before the proxy forwards it, so reading paydb first can never make a booked transfer look like
an orphan):

  * classify every SUBMITTING / RAIL_AMBIGUOUS payout by how many transfers the rail booked for
    its clientRef (the payout id, railproxy/models.py): NOT_BOOKED 0, BOOKED_ONCE 1,
    BOOKED_MULTIPLE >1, NO_SUBMISSION when the proxy holds no forwarded submission for it; and
    every POSTED / FAILED / ABANDONED payout whose transfers need a rail recovery or have one
    (the evidence payments/recovery.py records a recovery from);
  * invariants, every payout state against the statement (ARCHITECTURE decision 20):
    each account's balance = Σ CREDIT − Σ DEBIT of its ledger; Σ debits = Σ credits;
    POSTED: one ACKED submission or an operator resolution, and exactly one booked transfer
    that no rail recovery accounts for (its reference, when the payout names one), of the
    payout's amount; FAILED / ABANDONED: every booked transfer accounted for by a recovery;
    every recovery's transfer on the statement with its amount; no booked transfer lacks a
    submission. RAIL_AMBIGUOUS and SUBMITTING are classified, not violations (quarantine).

Shape: this module reads both books and writes the findings; `ops/invariants.py` holds the
checks (`Books.read` indexes what was read, `classify` classifies each payout once, `CHECKS`
maps each invariant to one function over (books, payouts)); `ops/report.py` the report and its
renderings; every finding carries what the operator does next (ops/guide.py: the payout's own
reference, the transfers that need a rail recovery, the exact commands).

Writes only its findings (`payout_reconciliation`, one row per classified payout) and the run's
verdict (`reconcile_run`, exported by payments' /metrics as `reconcile_ok` and
`reconcile_last_run_timestamp_seconds`). Raw SQL because it reads two apps' tables across two
databases in one snapshot each; the `payout` reads and the balances (a settlement account's
row plus its buckets) go through payments.selectors.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from django.db import OperationalError, connections, transaction

from dlock.budgets import BUDGETS
from dlock.dbrouter import alias_for
from dlock.timefmt import rfc3339_ms
from ops.guide import guide
from ops.invariants import CHECKS, Books, Payout, classify
from ops.report import Report
from payments.operator import record_reconcile_run
from payments.selectors import account_books, payouts_for_reconcile, rail_recoveries

if TYPE_CHECKING:
    import datetime as dt

FORWARDED_OUTCOMES = ("PENDING", "ACKED", "TIMEOUT", "DECLINED")

TOTALS_SQL = """
SELECT COALESCE(SUM(amount_minor) FILTER (WHERE direction = 'DEBIT'), 0),
       COALESCE(SUM(amount_minor) FILTER (WHERE direction = 'CREDIT'), 0)
  FROM ledger_entry
"""
RECONCILED_STATES = ("SUBMITTING", "RAIL_AMBIGUOUS", "POSTED", "FAILED", "ABANDONED")
QUARANTINE_STATES = ("SUBMITTING", "RAIL_AMBIGUOUS")
SUBMISSIONS_SQL = """
SELECT payout_id::text, client_ref, outcome, rail_reference FROM rail_submission
 WHERE outcome = ANY(%(outcomes)s)
"""
TRANSFERS_SQL = """
SELECT client_ref, rail_reference, amount_minor, currency, accepted_at FROM rail_transfer
"""
UPSERT_SQL = """
INSERT INTO payout_reconciliation
       (payout_id, classification, rail_transfer_count, rail_references, rail_transfers,
        checked_at)
VALUES (%(payout_id)s, %(classification)s, %(count)s, %(refs)s::jsonb, %(transfers)s::jsonb,
        clock_timestamp())
ON CONFLICT (payout_id) DO UPDATE
   SET classification = EXCLUDED.classification,
       rail_transfer_count = EXCLUDED.rail_transfer_count,
       rail_references = EXCLUDED.rail_references,
       rail_transfers = EXCLUDED.rail_transfers,
       checked_at = EXCLUDED.checked_at
"""
TIMEOUT_SQL = "SET LOCAL statement_timeout = %s"
SNAPSHOT_SQL = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY"


_T = TypeVar("_T")


def _with_retries(fn: Callable[[], _T]) -> _T:
    """C3 §3.8 "reconciler → both databases": 3 retries on a connection failure."""
    hop = BUDGETS["reconciler.db"]
    for attempt in range(hop.retries + 1):
        try:
            return fn()
        except OperationalError:
            if attempt >= hop.retries:
                raise
            time.sleep(hop.connect_s)
    raise AssertionError("unreachable")


def _read_paydb() -> dict[str, Any]:
    alias = alias_for("payments")
    nested = connections[alias].in_atomic_block  # e.g. under a test's transaction
    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
        if not nested:
            cursor.execute(SNAPSHOT_SQL)
        cursor.execute(TIMEOUT_SQL, [int(BUDGETS["reconciler.db"].read_s * 1000)])
        accounts = account_books(cursor)  # a settlement balance: its row + its buckets
        cursor.execute(TOTALS_SQL)
        debits, credits = cursor.fetchone()
        payouts = payouts_for_reconcile(cursor, states=RECONCILED_STATES)
        cursor.execute(SUBMISSIONS_SQL, {"outcomes": list(FORWARDED_OUTCOMES)})
        submissions = cursor.fetchall()
        recoveries = rail_recoveries(cursor)
    return {
        "recoveries": recoveries,
        "accounts": accounts,
        "debits": int(debits),
        "credits": int(credits),
        "payouts": payouts,
        "submissions": submissions,
    }


def _read_raildb() -> list[tuple[str, str, int, str, dt.datetime]]:
    alias = alias_for("railstub")
    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
        cursor.execute(TIMEOUT_SQL, [int(BUDGETS["reconciler.db"].read_s * 1000)])
        cursor.execute(TRANSFERS_SQL)
        return cursor.fetchall()


def _needs_finding(p: Payout) -> bool:
    """Quarantined payouts always; a settled one when its transfers need (or have) a recovery,
    or the statement lacks its reference (the evidence a recovery or a reversal is guarded by)."""
    if p.state in QUARANTINE_STATES:
        return True
    if p.state == "POSTED":
        return len(p.refs) != 1 or bool(p.covered) or p.posted_ref not in p.refs
    return bool(p.refs)


def reconcile(*, write: bool = True) -> Report:
    """Read both books, classify, run each invariant's check; write findings (only) when
    `write`."""
    books = Books.read(_with_retries(_read_paydb), _with_retries(_read_raildb))
    payouts = classify(books)
    report = Report(checked_at=rfc3339_ms(_now()) or "")
    report.violations = {name: check(books, payouts) for name, check in CHECKS.items()}
    for p in payouts:
        if _needs_finding(p):
            report.classifications[p.payout_id] = finding(p, books)
    tally = Counter(status for _, _, _, _, status, _ in books.pay["recoveries"])
    report.recoveries = {s: tally.get(s, 0) for s in ("OPEN", "RECOVERED", "WRITTEN_OFF")}
    states = Counter(p.state for p in payouts)
    report.counts = {
        "accounts": len(books.pay["accounts"]),
        "postedPayouts": states.get("POSTED", 0),
        "submittingPayouts": states.get("SUBMITTING", 0),
        "ambiguousPayouts": states.get("RAIL_AMBIGUOUS", 0),
        "failedPayouts": states.get("FAILED", 0),
        "abandonedPayouts": states.get("ABANDONED", 0),
        "railRecoveries": len(books.pay["recoveries"]),
        "railTransfers": len(books.rail),
        "violations": sum(len(v) for v in report.violations.values()),
    }
    if write:
        _write_findings(report)
    return report


def finding(p: Payout, books: Books) -> dict[str, Any]:
    """What the reconciler found for one payout and what the operator does next (ops.guide)."""
    own, needs, steps = guide(p)
    return {
        "state": p.state,
        "classification": p.classification,
        "railReferences": p.refs,
        "recoveredReferences": p.covered,
        "transfers": [books.statement[r] for r in p.refs],
        "ownReference": own,
        "needsRecovery": needs,
        "nextSteps": steps,
    }


def _write_findings(report: Report) -> None:
    """The classifications and the run's verdict, in one paydb transaction."""
    alias = alias_for("payments")
    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
        record_reconcile_run(
            cursor,
            ok=report.ok,
            violations=report.counts["violations"],
            classified=len(report.classifications),
            counts=json.dumps(report.counts, sort_keys=True),
        )
        for payout_id, finding in report.classifications.items():
            cursor.execute(
                UPSERT_SQL,
                {
                    "payout_id": payout_id,
                    "classification": finding["classification"],
                    "count": len(finding["railReferences"]),
                    "refs": json.dumps(finding["railReferences"]),
                    "transfers": json.dumps(finding["transfers"]),
                },
            )


def _now() -> dt.datetime:
    from django.utils import timezone

    return timezone.now()
