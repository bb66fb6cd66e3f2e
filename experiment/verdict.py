"""The verdict: did the claim hold, and was the experiment strong enough to prove anything?"""

from __future__ import annotations

from experiment.config import LANDED_PAUSES_MIN

# Exit codes of the experiment (and of `manage.py fencing_experiment`).
OK, FAIL, INCONCLUSIVE = 0, 1, 3


def unexplained_findings(reconcile: dict, truth: dict, payout_ids: list[str]) -> list:
    """This run's reconciler findings not explained by the rail's own duplicate acks.

    A duplicate ack books a second transfer for one request: the reconciler rightly flags the
    POSTED payout as booked twice (someone must claw it back), but no fence could prevent it, so
    it does not count against the fenced arm. Findings about other runs' payouts (earlier runs on
    the same stack, or the naive arm's transfers, which have no submission by design) are not
    this run's. Anything else counts.
    """
    report = reconcile.get("report")
    if not isinstance(report, dict):
        return [] if reconcile.get("exit_code") == 0 else ["reconciler gave no JSON report"]
    ours = set(payout_ids)
    rail_made = set(truth["rail_duplicate_payout_ids"])
    left = []
    for check, items in (report.get("violations") or {}).items():
        for item in items:
            subject = str(item.get("payoutId") or item.get("clientRef") or "")
            if subject and subject not in ours:
                continue
            if check == "posted_has_one_booked_transfer" and subject in rail_made:
                continue
            left.append({"check": check, **item})
    return left


def _per_phase(classified: dict) -> str:
    phases = classified.get("explained_by_phase") or {}
    return ", ".join(f"{phase} {n}" for phase, n in phases.items()) or "none"


def _landing_lines(arm: dict, name: str) -> tuple[int, list[str]]:
    """A run whose pauses must land: INCONCLUSIVE (with the count) when too few did."""
    landed = arm.get("pauses_landed") or {"total": 0, "by_phase": {}}
    phases = {p for p, n in landed["by_phase"].items() if n}
    where = ", ".join(f"{p} {n}" for p, n in sorted(landed["by_phase"].items())) or "none"
    if landed["total"] >= LANDED_PAUSES_MIN and len(phases) >= LANDED_PAUSES_MIN:
        return OK, [f"ok: {name} arm: {landed['total']} pauses landed ({where})"]
    return INCONCLUSIVE, [
        f"INCONCLUSIVE: only {landed['total']} pauses landed in the {name} arm ({where}); at"
        f" least {LANDED_PAUSES_MIN} in {LANDED_PAUSES_MIN} phases are needed"
    ]


def _fenced_lines(fenced: dict, *, expect_fenced_outs: bool = True) -> tuple[int, list[str]]:
    lines: list[str] = []
    code = OK
    if fenced.get("double_faults"):
        lines.append(
            "note: double faults (two faults on one role at once): "
            + "; ".join(
                f"{d['second']} @{d['at']}s while {d['first']} ({d['scope']})"
                for d in fenced["double_faults"]
            )
        )
    if fenced["duplicates_caused"] or fenced["invariant_violation_count"]:
        code = FAIL
        lines.append(
            f"FAIL: fenced arm caused {fenced['duplicates_caused']} duplicate payments and"
            f" broke {fenced['invariant_violation_count']} invariants"
        )
    recon = fenced.get("reconciler") or {}
    if recon.get("unexplained_violations"):
        code = FAIL
        lines.append(
            f"FAIL: the reconciler exited {recon.get('exit_code')} with findings the rail's"
            f" own duplicate acks do not explain: {recon['unexplained_violations'][:3]}"
        )
    elif recon.get("exit_code"):
        lines.append(
            f"note: the reconciler exited {recon['exit_code']}: it flags the rail's own"
            f" duplicate acks ({fenced['rail_duplicate_acks']}) for clawback, as it should"
        )
    configured = fenced.get("lock_backend")
    observed = fenced.get("lock_backend_observed") or []
    if configured and any(b != configured for b in observed):
        code = FAIL
        lines.append(
            f"FAIL: the lock server served acquires on {', '.join(observed)} during the run,"
            f" but the stack is configured for {configured}"
        )
    classified = fenced.get("fenced_out_classification")
    if classified is None:
        code = FAIL
        lines.append("FAIL: the fenced-outs were not classified against the schedule")
        return code, lines
    if classified["unexplained"]:
        code = FAIL
        reasons = [
            f"{e.get('owner', '?')} token {e.get('token', '?')} ({e['resource']}): {e['why']}"
            for e in classified["unexplained_events"][:3]
        ]
        lines.append(
            f"FAIL: {classified['unexplained']} fenced-outs the fault schedule does not explain"
            f" (of {classified['explained'] + classified['unexplained']}): " + "; ".join(reasons)
        )
    if not classified["explained"] and not expect_fenced_outs:
        if code == OK:
            lines.append(
                f"ok: {fenced['duplicates_caused']} duplicates caused, {classified['explained']}"
                " fenced-outs (a recovery run injects no stale writer)"
            )
    elif not classified["explained"]:
        code = code or INCONCLUSIVE
        lines.append("INCONCLUSIVE: no stale writer was fenced out (faults too weak)")
    elif code == OK:
        lines.append(
            f"ok: {classified['explained']} stale writes fenced out (every one explained by the"
            f" schedule; by phase: {_per_phase(classified)}),"
            f" {fenced['duplicates_caused']} duplicates caused"
        )
    return code, lines


def verdict(
    results: dict[str, dict], *, expect_fenced_outs: bool = True, pauses_must_land: bool = False
) -> tuple[int, list[str]]:
    """0 = the claim held and the experiment was strong enough; 1 = the fenced arm paid twice,
    broke an invariant, or was fenced out where no injected fault explains it (or ran on a lock
    backend other than the stack's); 3 = inconclusive (no stale writer caught, or the naive arm
    survived). `expect_fenced_outs=False` (the HA recovery run, no pauses) makes "no stale writer
    caught" no reason for 3. `pauses_must_land` (the CI preset): fewer than two landed pauses,
    or pauses in fewer than two phases, in an arm is 3 too, saying so."""
    lines: list[str] = []
    code = OK
    fenced = results.get("fenced")
    if fenced:
        code, lines = _fenced_lines(fenced, expect_fenced_outs=expect_fenced_outs)
    if pauses_must_land:
        for name, arm in results.items():
            landing, more = _landing_lines(arm, name)
            code = code or landing
            lines += more
    naive_arm = results.get("naive")
    if naive_arm:
        if not naive_arm["duplicates_caused"]:
            code = code or INCONCLUSIVE
            lines.append("INCONCLUSIVE: the naive arm paid nothing twice (faults too weak)")
        else:
            lines.append(
                f"ok: the naive arm paid {naive_arm['duplicates_caused']} payouts more than once"
            )
    return code, lines
