"""The experiment's report as a table (fenced vs naive side by side)."""

from __future__ import annotations

from collections import Counter

from experiment.recovery import recovery_lines

STATES = ("POSTED", "FAILED", "RAIL_AMBIGUOUS", "ABANDONED")
IN_FLIGHT = ("PENDING", "CLAIMED", "SUBMITTING", "RAIL_ACKED")


def _hist(h: dict[str, int]) -> str:
    return " ".join(f"{k}×:{v}" for k, v in h.items()) or "-"


def _dict(d: dict | None) -> str:
    if d is None:
        return "n/a"
    return " ".join(f"{k}={int(v) if isinstance(v, float) else v}" for k, v in d.items()) or "0"


def _classified(classification: dict | None, no_fences: bool) -> str:
    if no_fences:
        return "n/a"
    if classification is None:
        return "not classified"
    return f"{classification['explained']} | {classification['unexplained']}"


def _backend(arm: dict) -> str:
    served = arm.get("lock_backend_observed")
    if served is None:
        return "n/a (no lock server)"
    return f"{arm.get('lock_backend', '?')} | {','.join(served) or '-'}"


def rows(arm: dict) -> dict[str, str]:
    by_state = arm["by_state"]
    in_flight = {s: by_state[s] for s in IN_FLIGHT if by_state.get(s)}
    recon = arm.get("reconciler")
    pauses = Counter(p["phase"] for p in arm["faults"]["pauses"])
    return {
        "lock backend (stack | served)": _backend(arm),
        "payouts": str(arm["payouts"]),
        **{f"  {state}": str(by_state.get(state, 0)) for state in STATES},
        "  still in flight": _dict(in_flight) if in_flight else "0",
        "presented rail attempts": str(arm["presented_attempts_total"]),
        "attempts per payout (hist)": _hist(arm["presented_attempts_histogram"]),
        "DUPLICATES WE CAUSED (>1 presented)": str(arm["duplicates_caused"]),
        "  of which booked twice by us": str(arm["paid_twice_by_us"]),
        "rail's own duplicate acks": str(arm["rail_duplicate_acks"]),
        "rail transfers / money out": f"{arm['rail_transfers']} / {arm['money_out_minor']}",
        "ledger debits (payouts)": str(arm["ledger_debits_minor"]),
        "lock_fenced_out_total": (
            "n/a (no fences)"
            if arm["fenced_out_total"] is None
            else f"{int(arm['fenced_out_sum'])} ({_dict(arm['fenced_out_total'])})"
        ),
        "  /metrics scraped | executor logs": (
            "n/a"
            if arm.get("fenced_out_scraped") is None
            else f"{_dict(arm['fenced_out_scraped'])} | {_dict(arm['fenced_out_executor_logs'])}"
        ),
        "  explained | UNEXPLAINED by the schedule": _classified(
            arm.get("fenced_out_classification"), arm["fenced_out_total"] is None
        ),
        "rail submissions by outcome": _dict(arm["submission_outcomes"]),
        "ambiguous (quarantined)": str(arm["ambiguous"]),
        "  reconciler classification": _dict(arm["ambiguous_classification"]) or "-",
        "invariant violations": str(arm["invariant_violation_count"]),
        "reconciler exit code": "n/a" if recon is None else str(recon.get("exit_code")),
        "throughput (POSTED/s)": f"{arm['throughput_posted_per_s']:.2f}",
        "elapsed (s)": f"{arm['elapsed_s']:.1f}",
        "pauses by phase": _dict(dict(pauses)),
        "kill -9": str(len(arm["faults"]["kills"])),
        "fault errors": str(len(arm["faults"]["errors"])),
    }


def shared_rates_line(name: str, arm: dict) -> str | None:
    """The warning a run's table carries when earlier runs' payouts were still claimable."""
    leftovers = arm.get("earlier_runs_claimable") or 0
    if not leftovers:
        return None
    return (
        f"{name}: {leftovers} payouts of earlier runs were claimable when it began: its"
        " executors work on them too, so its POSTED/s are shared with them, not comparable"
        " (start from a clean stack: `make down`, `make clean`, or drain them with"
        " `manage.py run_executor --until-idle`)"
    )


def table(report: dict) -> str:
    arms = report["arms"]
    names = list(arms)
    columns = {name: rows(arms[name]) for name in names}
    labels = list(next(iter(columns.values())))
    width = max(len(label) for label in labels) + 2
    colw = max([18] + [len(v) + 2 for c in columns.values() for v in c.values() if len(v) < 60])
    lines = [f"{'':<{width}}" + "".join(f"{n:<{colw}}" for n in names)]
    lines.append("-" * (width + colw * len(names)))
    for label in labels:
        lines.append(f"{label:<{width}}" + "".join(f"{columns[n][label]:<{colw}}" for n in names))
    config = report["config"]
    lines.append("")
    lines.append(
        f"seed={config['seed']} executors={config['executors']}"
        f"x{config.get('executor_concurrency', 1)} in flight payouts={config['payouts']} "
        f"duration={config['duration']}s lease={config['lease_ms']}ms "
        f"faults={len(report['schedule'])} (replay: --seed {config['seed']})"
        f" lock backend={report.get('lock_backend', '?')}"
    )
    for line in report["verdict"]["lines"]:
        lines.append(line)
    for name in names:
        unexplained = (arms[name].get("fenced_out_classification") or {}).get("unexplained_events")
        if unexplained:
            lines.append(f"{name}: fenced-outs the schedule does not explain (first 5):")
            lines += [
                f"  - {e.get('owner', '?')} token {e.get('token', '?')} {e['resource']}: {e['why']}"
                for e in unexplained[:5]
            ]
        recovery = arms[name].get("recovery") or []
        if recovery:
            lines.append(f"{name}: time until the next POSTED payout after each fault:")
            lines += [
                f"  - {r['kind']} {r['target']} @{r['start']:.1f}s: "
                + ("never" if r["next_posted_after_s"] is None else f"{r['next_posted_after_s']}s")
                for r in recovery
            ]
        ha_recovery = arms[name].get("ha_recovery") or []
        shared = shared_rates_line(name, arms[name])
        if shared:
            lines.append(shared)
        if ha_recovery:
            lines.append(
                f"{name}: recovery per HA fault and replica (outage = first acquire/call that"
                " succeeded after the fault − the fault; goal ≤ 3 s):"
            )
            lines += [f"  {line}" for line in recovery_lines(ha_recovery)]
        violations = arms[name]["invariant_violations"][:5]
        if violations:
            lines.append(f"{name}: first invariant violations:")
            lines += [f"  - {v}" for v in violations]
        errors = arms[name]["faults"]["errors"][:5]
        if errors:
            lines.append(f"{name}: faults that could not be injected:")
            lines += [f"  - {e.strip()[:300]}" for e in errors]
    return "\n".join(lines)
