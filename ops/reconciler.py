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

Shape: `Books.read` indexes what was read; `_payouts` classifies each payout once; `CHECKS` maps
each invariant to one function over (books, payouts); every finding carries what the operator
does next (ops/guide.py: the payout's own reference, the transfers that need a rail recovery,
the exact commands).

Writes only its findings (`payout_reconciliation`, one row per classified payout) and the run's
verdict (`reconcile_run`, exported by payments' /metrics as `reconcile_ok` and
`reconcile_last_run_timestamp_seconds`). Raw SQL because it reads two apps' tables across two
databases in one snapshot each; the `payout` reads and the balances (a settlement account's
row plus its buckets) go through payments.selectors.
"""

from __future__ import annotations

import json
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from django.db import OperationalError, connections, transaction

from dlock.budgets import BUDGETS
from dlock.dbrouter import alias_for
from dlock.timefmt import rfc3339_ms
from ops.guide import guide
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


@dataclass
class Report:
    """What the reconciler found. `ok` is False when any invariant broke."""

    checked_at: str
    classifications: dict[str, dict[str, Any]] = field(default_factory=dict)
    violations: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    recoveries: dict[str, int] = field(default_factory=dict)

    INVARIANTS = (
        "balance_equals_ledger",
        "debits_equal_credits",
        "posted_has_one_acked_submission",
        "posted_has_one_booked_transfer",
        "failed_has_no_booked_transfer",
        "recovery_matches_statement",
        "transfer_has_submission",
    )

    @property
    def ok(self) -> bool:
        return not any(self.violations.values())

    def by_classification(self) -> dict[str, int]:
        tally = Counter(c["classification"] for c in self.classifications.values())
        return {name: tally.get(name, 0) for name in CLASSIFICATIONS}

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "checkedAt": self.checked_at,
            "counts": self.counts,
            "classifications": self.by_classification(),
            "payouts": self.classifications,
            "recoveries": self.recoveries,
            "violations": {name: self.violations.get(name, []) for name in self.INVARIANTS},
            "nextSteps": self.next_steps(),
        }

    def next_steps(self) -> list[str]:
        """The run's own advice: many transfers to record go as one reviewed plan."""
        needs = sum(len(f["needsRecovery"]) for f in self.classifications.values())
        if needs < 2:
            return []
        return [
            f"{needs} transfers need a rail recovery: review the plan with "
            "ROLE=ops manage.py record_rail_recovery --all-from-reconcile --dry-run, then apply "
            'it with --all-from-reconcile --reason "…" --operator YOUR_ADMIN_USER'
        ]


CLASSIFICATIONS = ("NOT_BOOKED", "BOOKED_ONCE", "BOOKED_MULTIPLE", "NO_SUBMISSION")

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


@dataclass
class Books:
    """Both books as read: paydb's snapshot and the rail's statement, indexed for the checks."""

    pay: dict[str, Any]
    rail: list[tuple[str, str, int, str, dt.datetime]]
    statement: dict[str, dict[str, Any]] = field(default_factory=dict)  # by rail reference
    order: dict[str, int] = field(default_factory=dict)  # rail reference -> position in time
    transfers: dict[str, list[str]] = field(default_factory=dict)  # by clientRef, in time order
    submissions: dict[str, list[tuple[str, str, str | None]]] = field(default_factory=dict)
    known_refs: set[str] = field(default_factory=set)  # clientRefs dlock submitted
    recovered: dict[str, set[str]] = field(default_factory=dict)  # by payout id

    @classmethod
    def read(cls, pay: dict[str, Any], rail: list[tuple]) -> Books:
        books = cls(pay=pay, rail=rail)
        transfers: dict[str, list[str]] = defaultdict(list)
        by_time = sorted(rail, key=lambda r: (r[4], r[1]))  # acceptedAt, then reference
        for order, (client_ref, ref, amount, currency, accepted_at) in enumerate(by_time):
            transfers[client_ref].append(ref)
            books.order[ref] = order
            books.statement[ref] = {
                "railReference": ref,
                "amountMinor": int(amount),
                "currency": currency,
                "acceptedAt": rfc3339_ms(accepted_at),
            }
        books.transfers = dict(transfers)
        subs: dict[str, list[tuple[str, str, str | None]]] = defaultdict(list)
        for payout_id, client_ref, outcome, ref in pay["submissions"]:
            subs[payout_id].append((client_ref, outcome, ref))
            books.known_refs.add(client_ref)
        books.submissions = dict(subs)
        recovered: dict[str, set[str]] = defaultdict(set)
        for ref, payout_id, _, _, _, _ in pay["recoveries"]:
            recovered[payout_id or ""].add(ref)
        books.recovered = dict(recovered)
        return books

    def refs_of(self, payout_id: str) -> list[str]:
        """The payout's transfers on the statement (by its submissions' clientRefs and its id),
        oldest first."""
        found = {
            ref
            for client_ref, _, _ in self.submissions.get(payout_id, [])
            for ref in self.transfers.get(client_ref, [])
        } | set(self.transfers.get(payout_id, []))
        return sorted(found, key=lambda r: self.order[r])


@dataclass(frozen=True)
class Payout:
    """One reconciled payout with its statement transfers (the per-payout checks' input)."""

    payout_id: str
    state: str
    posted_ref: str | None
    amount: int
    by_operator: bool
    classification: str
    refs: list[str]  # on the statement, oldest first
    covered: list[str]  # of those, the ones a rail recovery accounts for
    acked: int  # ACKED submissions

    @property
    def left(self) -> list[str]:
        return [r for r in self.refs if r not in self.covered]


def _payouts(books: Books) -> list[Payout]:
    found = []
    for payout_id, state, posted_ref, amount, _currency, by_operator in books.pay["payouts"]:
        submissions = books.submissions.get(payout_id, [])
        refs = books.refs_of(payout_id)
        if not submissions:
            classification = "NO_SUBMISSION"
        elif not refs:
            classification = "NOT_BOOKED"
        else:
            classification = "BOOKED_ONCE" if len(refs) == 1 else "BOOKED_MULTIPLE"
        covered = [r for r in refs if r in books.recovered.get(payout_id, set())]
        found.append(
            Payout(
                payout_id=payout_id,
                state=state,
                posted_ref=posted_ref,
                amount=int(amount),
                by_operator=by_operator,
                classification=classification,
                refs=refs,
                covered=covered,
                acked=sum(1 for s in submissions if s[1] == "ACKED"),
            )
        )
    return found


# One check per invariant (Report.INVARIANTS): each returns its violations.


def _balance_equals_ledger(books: Books, payouts: list[Payout]) -> list[dict[str, Any]]:
    return [
        {"accountId": account_id, "balanceMinor": int(balance), "ledgerSumMinor": int(ledger)}
        for account_id, balance, ledger in books.pay["accounts"]
        if int(balance) != int(ledger)
    ]


def _debits_equal_credits(books: Books, payouts: list[Payout]) -> list[dict[str, Any]]:
    debits, credits = books.pay["debits"], books.pay["credits"]
    return [] if debits == credits else [{"debitsMinor": debits, "creditsMinor": credits}]


def _posted_has_one_acked_submission(books: Books, payouts: list[Payout]) -> list[dict]:
    return [
        {"payoutId": p.payout_id, "ackedSubmissions": p.acked}
        for p in payouts
        if p.state == "POSTED" and p.acked != 1 and not (p.by_operator and p.posted_ref in p.refs)
    ]


def _posted_has_one_booked_transfer(books: Books, payouts: list[Payout]) -> list[dict]:
    found: list[dict[str, Any]] = []
    for p in payouts:
        if p.state != "POSTED":
            continue
        left = p.left
        if len(left) != 1 or (p.posted_ref is not None and left != [p.posted_ref]):
            found.append(
                {
                    "payoutId": p.payout_id,
                    "bookedTransfers": len(left),
                    "railReferences": left,
                    "recoveredReferences": p.covered,
                    "ownReference": p.posted_ref,
                }
            )
        elif books.statement[left[0]]["amountMinor"] != p.amount:
            found.append(
                {
                    "payoutId": p.payout_id,
                    "railReference": left[0],
                    "amountMinor": p.amount,
                    "statementAmountMinor": books.statement[left[0]]["amountMinor"],
                }
            )
    return found


def _failed_has_no_booked_transfer(books: Books, payouts: list[Payout]) -> list[dict]:
    """Money that left for a FAILED / ABANDONED payout must be a recorded recovery."""
    return [
        {"payoutId": p.payout_id, "state": p.state, "railReferences": p.left}
        for p in payouts
        if p.state in ("FAILED", "ABANDONED") and p.left
    ]


def _recovery_matches_statement(books: Books, payouts: list[Payout]) -> list[dict]:
    found = []
    for ref, payout_id, amount, currency, _status, _ in books.pay["recoveries"]:
        on_statement = books.statement.get(ref)
        if on_statement is None or (on_statement["amountMinor"], on_statement["currency"]) != (
            amount,
            currency,
        ):
            found.append(
                {
                    "railReference": ref,
                    "payoutId": payout_id,
                    "amountMinor": amount,
                    "currency": currency,
                    "statement": on_statement,
                }
            )
    return found


def _transfer_has_submission(books: Books, payouts: list[Payout]) -> list[dict]:
    return [
        {"clientRef": client_ref, "railReference": ref}
        for client_ref, refs in books.transfers.items()
        if client_ref not in books.known_refs
        for ref in refs
    ]


CHECKS: dict[str, Callable[[Books, list[Payout]], list[dict[str, Any]]]] = {
    "balance_equals_ledger": _balance_equals_ledger,
    "debits_equal_credits": _debits_equal_credits,
    "posted_has_one_acked_submission": _posted_has_one_acked_submission,
    "posted_has_one_booked_transfer": _posted_has_one_booked_transfer,
    "failed_has_no_booked_transfer": _failed_has_no_booked_transfer,
    "recovery_matches_statement": _recovery_matches_statement,
    "transfer_has_submission": _transfer_has_submission,
}


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
    payouts = _payouts(books)
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


def metrics_text(report: Report) -> str:
    """The counts in Prometheus text format (for a node-exporter textfile collector)."""
    from prometheus_client import CollectorRegistry, Gauge, generate_latest

    registry = CollectorRegistry()
    classified = Gauge(
        "reconcile_payouts",
        "SUBMITTING/RAIL_AMBIGUOUS (and anomalous settled) payouts by rail classification.",
        ["classification"],
        registry=registry,
    )
    for name, count in report.by_classification().items():
        classified.labels(classification=name).set(count)
    broken = Gauge(
        "reconcile_violations", "Invariant violations found.", ["invariant"], registry=registry
    )
    for name in Report.INVARIANTS:
        broken.labels(invariant=name).set(len(report.violations.get(name, [])))
    Gauge("reconcile_ok", "1 when every invariant held.", registry=registry).set(int(report.ok))
    Gauge(
        "reconcile_last_run_timestamp_seconds", "When the reconciler last ran.", registry=registry
    ).set(time.time())
    return generate_latest(registry).decode()


def render_text(report: Report) -> str:
    """The human report."""
    lines = [f"reconciliation at {report.checked_at}: {'OK' if report.ok else 'INVARIANT BROKEN'}"]
    lines.append(
        "  counts: " + ", ".join(f"{name}={value}" for name, value in report.counts.items())
    )
    lines.append(
        "  classification: "
        + ", ".join(f"{name}={count}" for name, count in report.by_classification().items())
    )
    lines.append(
        "  rail recoveries: "
        + (", ".join(f"{name}={count}" for name, count in report.recoveries.items()) or "none")
    )
    for payout_id, found in sorted(report.classifications.items()):
        refs = ",".join(found["railReferences"]) or "-"
        lines.append(f"    {payout_id} {found['state']:<14} {found['classification']:<15} {refs}")
        if found["ownReference"]:
            lines.append(f"      own reference (the payout's transfer): {found['ownReference']}")
        for n, ref in enumerate(found["needsRecovery"], 1):
            lines.append(f"      needs a rail recovery #{n}: {ref}")
        lines.extend(f"      next: {step}" for step in found["nextSteps"])
    lines.extend(f"  next: {step}" for step in report.next_steps())
    for name in Report.INVARIANTS:
        found = report.violations.get(name, [])
        lines.append(f"  {'FAIL' if found else 'ok  '} {name} ({len(found)})")
        lines.extend(f"      {json.dumps(item, sort_keys=True)}" for item in found[:20])
        if len(found) > 20:
            lines.append(f"      … {len(found) - 20} more")
    return "\n".join(lines)
