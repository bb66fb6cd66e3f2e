"""The reconciler's report: what it found (`Report`, also the `--json` answer) and its two
renderings, the human text and the Prometheus textfile."""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

CLASSIFICATIONS = ("NOT_BOOKED", "BOOKED_ONCE", "BOOKED_MULTIPLE", "NO_SUBMISSION")


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
