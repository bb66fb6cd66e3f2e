"""The fenced arm: the real executors against the stack's lock server, payments and rail proxy."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING

from experiment.fenced_outs import classify, events_from_logs
from experiment.measure import FENCED_NON_TERMINAL, CounterScraper
from experiment.stack import MissingPiece, scrape
from experiment.verdict import unexplained_findings
from experiment.workers import spawn_executor

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path
    from subprocess import Popen

    from experiment.arms import ArmContext
    from experiment.config import ExperimentConfig
    from experiment.fenced_outs import Fault
    from experiment.stack import StackHandle
    from experiment.workers import Worker

FENCING_ROLES = ("payments", "railproxy")
ACQUIRES = re.compile(r'^lock_acquire_total\{[^}]*backend="(?P<backend>[^"]+)"[^}]*\}\s+(\S+)$')


def seed_fenced(stack: StackHandle, config: ExperimentConfig) -> dict[str, list[str]]:
    result = stack.manage(
        "seed_payouts",
        "--accounts",
        str(config.n_accounts),
        "--payouts-per-account",
        str(config.per_account),
        "--balance-minor",
        str(config.per_account * config.amount_minor * 2),
        "--amount-minor",
        str(config.amount_minor),
        "--json",
    )
    if result.returncode != 0:
        raise MissingPiece(f"manage.py seed_payouts failed (issue 5):\n{result.stderr[-1500:]}")
    for line in reversed(result.stdout.strip().splitlines()):
        if line.startswith("{"):
            data = json.loads(line)
            return {"accounts": data["accounts"], "payouts": [str(p) for p in data["payouts"]]}
    raise MissingPiece(f"seed_payouts --json printed no JSON object:\n{result.stdout[-500:]}")


class BackendWatch:
    """Which lock backends the lock server really served acquires on during the arm
    (`lock_acquire_total{backend=…}` rising, restarts included)."""

    def __init__(self) -> None:
        self.last: dict[tuple[str, str], float] = {}
        self.seen: set[str] = set()

    def observe(self, source: str, text: str | None, *, baseline: bool = False) -> None:
        if text is None:
            return
        now: dict[str, float] = {}
        for line in text.splitlines():
            match = ACQUIRES.match(line.strip())
            if match:
                now[match["backend"]] = now.get(match["backend"], 0.0) + float(match[2])
        for backend, value in now.items():
            before = self.last.get((source, backend))
            rose = value > before if before is not None else value > 0 and not baseline
            if before is not None and value < before:
                rose = value > 0  # restarted: anything counted since is new
            if rose:
                self.seen.add(backend)
            self.last[(source, backend)] = value


class FencedArm:
    name = "fenced"
    non_terminal = FENCED_NON_TERMINAL
    needed_commands = {
        "railstub_config": "issue 6 (rail stub)",
        "seed_payouts": "issue 5 (payments)",
        "run_executor": "issue 7 (executor)",
        "reconcile": "issue 7 (reconciler)",
    }

    def __init__(self) -> None:
        self.fenced_out = CounterScraper("lock_fenced_out_total", "resource")
        self.backends = BackendWatch()

    def seed(self, ctx: ArmContext) -> dict[str, list[str]]:
        return seed_fenced(ctx.stack, ctx.config)

    def spawner(self, ctx: ArmContext) -> Callable[..., Popen]:
        lease_ms = ctx.config.lease_ms
        # The executor's lease: short, so pauses and a slow rail outlive it.
        env = {
            "LOCK_DEFAULT_TTL_MS": str(lease_ms),
            "LOCK_SESSION_TTL_MS": str(max(lease_ms, 1000)),
        }
        return spawn_executor(
            ctx.stack.env, ctx.logdir, env, concurrency=ctx.config.executor_concurrency
        )

    def start_sampling(self, ctx: ArmContext) -> None:
        for role in FENCING_ROLES:
            for url in ctx.stack.urls(role):  # every replica counts its own
                self.fenced_out.scrape(url, url, baseline=True)
        for url in ctx.stack.urls("lockserver"):
            self.backends.observe(url, scrape(url), baseline=True)

    def sample(self, ctx: ArmContext) -> dict[str, float]:
        for role in FENCING_ROLES:
            for url in ctx.stack.urls(role):
                self.fenced_out.scrape(url, url)
        for url in ctx.stack.urls("lockserver"):
            self.backends.observe(url, scrape(url))
        return dict(self.fenced_out.total)

    def held_lock(self, ctx: ArmContext, worker: Worker) -> tuple[str, int | None] | None:
        """The lock the stopped executor holds, from its log: the section its pause hook stopped
        in (`executor_paused`), else its last section still open (started, no
        `payout_executed` yet; a concurrent executor has several), else its last section."""
        started: dict[object, tuple[str, int | None]] = {}
        still_open: dict[object, tuple[str, int | None]] = {}
        paused: tuple[str, int | None] | None = None
        last: tuple[str, int | None] | None = None
        path = ctx.logdir / f"{worker.owner_id}.log"
        for line in path.read_text(errors="replace").splitlines() if path.exists() else []:
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            event, token = entry.get("event"), entry.get("token")
            if event == "executor_section_started" and entry.get("key"):
                section = (str(entry["key"]), token if isinstance(token, int) else None)
                started[token] = still_open[token] = last = section
            elif event == "payout_executed":
                still_open.pop(token, None)
            elif event == "executor_paused" and token in started:
                paused = started[token]
        if paused is not None:
            return paused
        return list(still_open.values())[-1] if still_open else last

    def revoke(self, ctx: ArmContext, *, key: str, token: int | None, owner: str) -> str:
        """L8 plus the push of the new floor to the account fence and the rail high-water (what
        `manage.py revoke_lock` does, done in-process: a fresh manage.py needs ~2 s to start,
        longer than a CI lease). Returns a note when there was nothing left to revoke."""
        from dlock.client import FencedOut, LockClient, NotFound
        from ops.revoke import protected_account, push_floor

        client = LockClient(ctx.stack.url("lockserver"), owner_id="fencing-experiment")
        try:
            outcome = client.revoke(
                key,
                operator="fencing-experiment",
                reason="holder paused past its lease (injected fault)",
                expected_token=token or None,
            )
        except (FencedOut, NotFound) as exc:
            # The CAS guard: the victim's grant lapsed (and perhaps a rival took the key) before
            # the operator got there — L8 refuses, correctly; a rival's writes fence the victim.
            return f"revoke of {key} came after the lease lapsed: {exc.code} {exc.message}"[:200]
        account = protected_account(key)
        if account is not None:
            push_floor(
                account_id=account,
                floor=int(outcome["newTokenFloor"]),
                pay_database_url=ctx.stack.env["PAY_DATABASE_URL"],
            )
        return ""

    def summarise(self, ctx: ArmContext, *, truth: dict, faults: list[Fault], kills: int) -> dict:
        result = ctx.stack.manage("reconcile", "--json")
        reconcile: dict = {"exit_code": result.returncode}
        try:
            reconcile["report"] = json.loads(result.stdout)
        except ValueError:
            reconcile["output"] = (result.stdout + result.stderr)[-2000:]
        reconcile["unexplained_violations"] = unexplained_findings(reconcile, truth, ctx.payout_ids)
        # The truth was collected before this reconcile ran (finding 4): its classification of
        # the quarantine is the reconciler's verdict of this run, read from its report.
        ambiguous_classification = classified_after_reconcile(reconcile, ctx.payout_ids)
        # A service restarted between two scrapes loses its counter; the executors' own log
        # lines (one `executor_fenced_out` per fenced write, in files we own) and the proxy's
        # durable FENCED rows don't. Per resource, the largest of the three counts.
        logged = fenced_out_in_logs(ctx.logdir)
        total = dict(self.fenced_out.total)
        total["rail"] = max(total.get("rail", 0), truth["submission_outcomes"].get("FENCED", 0))
        for resource, n in logged.items():
            total[resource] = max(total.get(resource, 0), n)
        events = events_from_logs(ctx.logdir, wall0=ctx.wall0)
        seen = {r: sum(1 for e in events if e.resource == r) for r in total}
        unseen = {r: int(n - seen[r]) for r, n in total.items() if n > seen[r]}
        classification = classify(
            events,
            faults,
            lease_s=ctx.config.lease_ms / 1000,
            unseen=unseen,
            kills=kills,
            per_kill=ctx.config.executor_concurrency,
        )
        return {
            "reconciler": reconcile,
            "ambiguous_classification": ambiguous_classification,
            "fenced_out_total": total,
            "fenced_out_sum": sum(total.values()),
            "fenced_out_scraped": dict(self.fenced_out.total),
            "fenced_out_executor_logs": logged,
            "fenced_out_classification": classification,
            "lock_backend_observed": sorted(self.backends.seen),
        }


def classified_after_reconcile(reconcile: dict, payout_ids: list[str]) -> dict[str, int]:
    """This run's RAIL_AMBIGUOUS payouts by the classification `reconcile --json` just gave
    them (UNCLASSIFIED only when the reconciler gave no report)."""
    report = reconcile.get("report")
    findings = (report or {}).get("payouts") or {} if isinstance(report, dict) else {}
    ours = set(payout_ids)
    tally: dict[str, int] = {}
    for payout_id, finding in findings.items():
        if payout_id in ours and finding.get("state") == "RAIL_AMBIGUOUS":
            name = str(finding.get("classification") or "UNCLASSIFIED")
            tally[name] = tally.get(name, 0) + 1
    return dict(sorted(tally.items()))


def fenced_out_in_logs(logdir: Path) -> dict[str, int]:
    """`executor_fenced_out` events in the executors' logs, by resource."""
    counts: dict[str, int] = {}
    for path in logdir.glob("*.log"):
        for line in path.read_text(errors="replace").splitlines():
            if '"executor_fenced_out"' not in line:
                continue
            try:
                details = json.loads(line).get("details") or {}
            except ValueError:
                continue
            resource = str(details.get("resourceType") or "unknown")
            counts[resource] = counts.get(resource, 0) + 1
    return counts
