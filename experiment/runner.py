"""Run one arm (or both) of the fencing experiment against a stack and report.

Steps per arm: seed the workload → set the rail to its base config → start K workers → replay the
fault schedule for `duration` seconds (sampling states and /metrics as it goes) → heal every
fault → drain until no payout is in flight (or the drain deadline) → stop the workers → run the
reconciler (fenced arm) → read the ground truth (`experiment.measure.collect`).
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import psycopg

from experiment import naive
from experiment.measure import (
    FENCED_NON_TERMINAL,
    NAIVE_NON_TERMINAL,
    CounterScraper,
    collect,
    state_counts,
)
from experiment.schedule import (
    KILL,
    PAUSE,
    PG_RESTART,
    RAIL_WINDOWS,
    RESTART,
    FaultEvent,
    build_schedule,
    rail_config_at,
)
from experiment.stack import MissingPiece, StackHandle
from experiment.workers import WorkerPool, proc_state, spawn_executor, spawn_naive

ARMS = ("fenced", "naive")
HOLD_MS = 3_000  # a drop-before-booking holds the connection this long (below the read timeouts)
# A CI-sized run: both arms in well under two minutes on two cores (seed 7 shows both effects).
CI_PRESET = {
    "executors": 3,
    "accounts": 3,  # with 2, a freshly armed executor can starve on contention for seconds
    "payouts": 54,
    "duration": 20.0,
    "lease_ms": 1500,
    "drain_timeout": 30.0,
}
EXECUTOR_PHASES = {
    "locked": "before_claim",
    "claimed": "before_submit",
    "submitted": "before_post",
    "posted": "",
}


@dataclass
class ExperimentConfig:
    seed: int = 7
    executors: int = 4
    payouts: int = 240
    accounts: int = 0  # 0 = as many as executors (contention: workers share accounts)
    duration: float = 40.0
    lease_ms: int = 2000
    base_latency_ms: int | None = None  # None = paced so the work spans the fault phase
    amount_minor: int = 1_000
    drain_timeout: float = 60.0
    arm: str = "both"
    out: Path = Path(".run/experiment")
    pg_restart: bool = True
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])

    @property
    def base_latency(self) -> int:
        """The rail's latency outside fault windows. Paced so K workers need ~85 % of the fault
        phase for the workload (faults must hit work in flight), capped at 40 % of the lease."""
        if self.base_latency_ms is not None:
            return self.base_latency_ms
        per_payout = self.executors * 0.85 * self.duration / max(1, self.payouts)
        return int(max(0.0, min(per_payout - 0.1, 0.4 * self.lease_ms / 1000)) * 1000)

    @property
    def n_accounts(self) -> int:
        # Half as many accounts as workers: a lease that lapses is taken over at once.
        return self.accounts or max(2, self.executors // 2)

    @property
    def per_account(self) -> int:
        return max(1, self.payouts // self.n_accounts)

    def arms(self) -> list[str]:
        return list(ARMS) if self.arm == "both" else [self.arm]


Progress = Callable[[str, float, dict[str, int], dict[str, float], str], None]


def _quiet(*_args) -> None:
    return None


RAIL_CONFIG_UPDATE = """
UPDATE railstub_config
   SET latency_ms = %(latency)s, failure_rate = %(failure)s, duplicate_ack_rate = %(duplicate)s,
       decline_rate = 0, updated_at = clock_timestamp()
 WHERE id = 1
"""


class RailConfigurator:
    """Applies the wanted rail config in the background (a manage.py call takes ~1 s); the last
    wanted config always wins."""

    def __init__(self, stack: StackHandle) -> None:
        self.stack = stack
        self.wanted: dict | None = None
        self.applied: dict | None = None
        self.errors: list[str] = []
        self.cond = threading.Condition()
        self.closed = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def want(self, config: dict) -> None:
        with self.cond:
            if config != self.wanted:
                self.wanted = dict(config)
                self.cond.notify()

    def _run(self) -> None:
        while True:
            with self.cond:
                while not self.closed and self.wanted == self.applied:
                    self.cond.wait()
                if self.closed and self.wanted == self.applied:
                    return
                config = dict(self.wanted or {})
            self.apply_now(config)
            with self.cond:
                self.applied = config
                self.cond.notify_all()

    def reset(self, *, seed: int, hold_ms: int) -> None:
        """Once per arm, through the stub's own command: a well-behaved, seeded rail."""
        result = self.stack.manage(
            "railstub_config", "--reset", "--seed", str(seed), "--hold-ms", str(hold_ms)
        )
        if result.returncode != 0:
            raise MissingPiece(
                "manage.py railstub_config failed (issue 6):\n" + (result.stderr or "")[-1500:]
            )
        self.applied = None

    def apply_now(self, config: dict) -> None:
        """Live changes write the stub's config row directly (read per request by the stub):
        a manage.py process per change would cost a core-second on a two-core box."""
        params = {
            "latency": int(config["latency_ms"]),
            "failure": float(config["failure_rate"]),
            "duplicate": float(config["duplicate_ack_rate"]),
        }
        for attempt in range(5):  # PostgreSQL may be restarting right now
            try:
                with psycopg.connect(self.stack.env["RAIL_DATABASE_URL"], connect_timeout=2) as c:
                    c.execute(RAIL_CONFIG_UPDATE, params)
                return
            except psycopg.Error as exc:
                error = str(exc)
                time.sleep(0.5 + attempt)
        self.errors.append(f"rail config {params}: {error[:300]}")

    def settle(self, timeout: float = 30) -> None:
        with self.cond:
            self.cond.wait_for(lambda: self.wanted == self.applied, timeout)

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()
        self.thread.join(30)


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


def check_commands(stack: StackHandle, arm: str) -> None:
    """Fail loudly, naming the missing piece, before any fault is injected."""
    from django.conf import settings

    if settings.configured and "executor" in settings.INSTALLED_APPS:
        from django.core.management import get_commands

        commands = get_commands()
    else:  # outside Django (make demo): ask manage.py itself, as the ops role
        result = stack.manage("help", "--commands")
        commands = dict.fromkeys(result.stdout.split())
    needed = {"railstub_config": "issue 6 (rail stub)"}
    if arm == "fenced":
        needed |= {
            "seed_payouts": "issue 5 (payments)",
            "run_executor": "issue 7 (executor)",
            "reconcile": "issue 7 (reconciler)",
        }
    missing = [f"manage.py {name} — {who}" for name, who in needed.items() if name not in commands]
    if missing:
        raise MissingPiece(
            "the experiment needs pieces that are not built yet:\n  " + "\n  ".join(missing)
        )


def run_arm(
    arm: str,
    stack: StackHandle,
    config: ExperimentConfig,
    schedule: list[FaultEvent],
    *,
    progress: Progress = _quiet,
) -> dict:
    out = Path(config.out)
    logdir = out / "logs" / arm
    logdir.mkdir(parents=True, exist_ok=True)
    pause_dir = out / "pause" / arm
    pay_url = stack.env["PAY_DATABASE_URL"]
    rail_db = stack.env["RAIL_DATABASE_URL"]
    run_id = f"{config.run_id}-{arm}"

    rail = RailConfigurator(stack)
    rail.reset(seed=config.seed, hold_ms=HOLD_MS)
    rail.want(rail_config_at([], 0, base_latency_ms=config.base_latency))
    rail.settle()
    if rail.errors:
        raise MissingPiece(f"the rail stub's config row could not be written:\n{rail.errors[-1]}")

    if arm == "fenced":
        seeded = seed_fenced(stack, config)
        spawn = spawn_executor(
            stack.env,
            logdir,
            {
                # The executor's lease: short, so pauses and a slow rail outlive it.
                "LOCK_DEFAULT_TTL_MS": str(config.lease_ms),
                "LOCK_SESSION_TTL_MS": str(max(config.lease_ms, 1000)),
            },
        )
        non_terminal = FENCED_NON_TERMINAL
    else:
        seeded = naive.seed(
            pay_url,
            run_id=run_id,
            accounts=config.n_accounts,
            payouts_per_account=config.per_account,
            balance_minor=config.per_account * config.amount_minor * 2,
            amount_minor=config.amount_minor,
        )
        spawn = spawn_naive(
            pay_url=pay_url,
            rail_url=stack.url("railstub"),
            run_id=run_id,
            lease_ms=config.lease_ms,
            pause_dir=pause_dir,
            logdir=logdir,
        )
        non_terminal = NAIVE_NON_TERMINAL
    payout_ids = seeded["payouts"]

    fenced_out = CounterScraper("lock_fenced_out_total", "resource")
    executed = CounterScraper("payout_execute_total", "outcome")
    if arm == "fenced":
        for role in ("payments", "railproxy"):
            fenced_out.scrape(role, stack.url(role), baseline=True)

    t0 = time.monotonic()

    def clock() -> float:
        return time.monotonic() - t0

    if arm == "fenced":
        # The executor's own pause hook (executor/pause.py): there is no phase after the post.
        pool = WorkerPool(
            arm,
            config.executors,
            spawn,
            pause_dir,
            clock,
            hook="respawn",
            phase_map=EXECUTOR_PHASES,
            hook_grace=20.0,
        )
    else:
        pool = WorkerPool(arm, config.executors, spawn, pause_dir, clock, hook="file")
    windows: list[dict] = []
    threads: list[threading.Thread] = []
    errors: list[str] = []

    def background(event: FaultEvent, action: Callable[[], None]) -> None:
        record = {"kind": event.kind, "target": event.target, "start": clock(), "end": None}
        windows.append(record)

        def run() -> None:
            try:
                action()
            except Exception as exc:  # noqa: BLE001 - a failed fault is reported, not fatal
                errors.append(f"{event.kind} {event.target}: {exc}")
            finally:
                record["end"] = clock()

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        threads.append(thread)

    series: list[dict] = []
    counts: dict[str, int] = {}
    status = {"label": "warming up", "stop": False}

    def sampler() -> None:
        """States every 0.5 s, /metrics every 1 s — in the background, so a slow or paused
        endpoint never delays a fault."""
        nonlocal counts
        last_scrape = -1.0
        while not status["stop"]:
            now = clock()
            if now - last_scrape >= 1.0:
                last_scrape = now
                if arm == "fenced":
                    for role in ("payments", "railproxy"):
                        fenced_out.scrape(role, stack.url(role))
                for worker in list(pool.workers.values()):
                    if worker.metrics_port and proc_state(worker.process.pid) not in ("", "T"):
                        executed.scrape(worker.owner_id, f"http://127.0.0.1:{worker.metrics_port}")
            try:
                counts = state_counts(pay_url, arm=arm, payout_ids=payout_ids, run_id=run_id)
            except Exception:  # noqa: BLE001 - PostgreSQL may be restarting right now
                time.sleep(0.5)
                continue
            series.append({"t": round(now, 2), **counts})
            progress(arm, now, counts, dict(fenced_out.total), status["label"])
            time.sleep(max(0.0, 0.5 - (clock() - now)))

    revokes: list[tuple[FaultEvent, str]] = []  # (event, victim owner id) awaiting its stop
    notes: list[str] = []

    def revoke_when_stopped() -> None:
        for item in list(revokes):
            event, owner = item
            worker = next((w for w in pool.workers.values() if w.owner_id == owner), None)
            if worker is None:
                revokes.remove(item)  # killed or replaced first: nothing to revoke
                continue
            if worker.stopped_at is None:
                continue
            revokes.remove(item)
            held = held_lock(arm, worker, logdir)
            if held is None:  # stopped from outside, between sections: nothing to revoke
                notes.append(f"revoke skipped: {owner} held no lock when it stopped")
                continue
            key, token = held

            def evict(key=key, token=token) -> None:
                outcome = revoke(stack, arm, key, token, pay_url)
                if outcome:
                    notes.append(outcome)

            background(replace(event, kind=REVOKE, target=key), evict)

    pool.start()
    sampling = threading.Thread(target=sampler, daemon=True)
    sampling.start()
    pending = list(schedule)
    try:
        while clock() < config.duration:
            now = clock()
            deferred = []
            while pending and pending[0].at <= now:
                event = pending.pop(0)
                status["label"] = f"{event.kind} {event.target}".strip()
                if event.kind == PAUSE:
                    if not pool.pause(int(event.target), event.params["phase"], event.seconds):
                        deferred.append(event)  # rivals first: retried once a pause ends
                    elif event.params.get("revoke"):
                        victim = pool.workers[int(event.target) % pool.size]
                        revokes.append((event, pool.last_paused or victim.owner_id))
                elif event.kind == KILL:
                    pool.kill(int(event.target))
                    windows.append({"kind": KILL, "target": event.target, "start": now, "end": now})
                elif event.kind == RESTART:
                    background(event, lambda role=event.target: stack.restart_role(role))
                elif event.kind == PG_RESTART:
                    background(event, stack.restart_pg)
            for event in deferred:
                pending.insert(0, replace(event, at=now + 0.5))
            pending.sort(key=lambda e: e.at)
            rail.want(rail_config_at(schedule, now, base_latency_ms=config.base_latency))
            pool.tick()
            revoke_when_stopped()
            time.sleep(0.05)
        # Heal: the rail behaves, everyone stopped runs again, every restarted piece is back.
        # A pause already armed may still land in the drain; it is resumed on time by tick().
        status["label"] = "healing + draining"
        rail.want(rail_config_at([], 0, base_latency_ms=0))
        pool.fallback = False  # a pause in progress runs its course: tick() resumes it on time
        for thread in threads:
            thread.join(90)
        stack.wait_ready(60)
        drain_start = clock()
        while clock() - drain_start < config.drain_timeout:
            pool.tick()
            if len(series) > 2 and not any(counts.get(s, 0) for s in non_terminal):
                break
            time.sleep(0.1)
        elapsed = clock()
    finally:
        pool.stop_all(timeout=8)
        rail.close()
        status["stop"] = True
        sampling.join(10)
    status["label"] = "done"
    with contextlib.suppress(Exception):  # reported below from the databases anyway
        counts = state_counts(pay_url, arm=arm, payout_ids=payout_ids, run_id=run_id)
        series.append({"t": round(clock(), 2), **counts})
        progress(arm, clock(), counts, dict(fenced_out.total), "done")

    for w in windows:
        if w["end"] is None:
            w["end"] = elapsed
    for record in pool.pauses:
        windows.append(
            {
                "kind": PAUSE,
                "target": record.worker,
                "phase": record.phase,
                "start": record.start,
                "end": record.end if record.end is not None else elapsed,
            }
        )
    for event in schedule:
        if event.kind in RAIL_WINDOWS:
            windows.append(
                {
                    "kind": event.kind,
                    "target": json.dumps(event.params),
                    "start": event.at,
                    "end": event.at + event.seconds,
                }
            )

    reconcile = None
    if arm == "fenced":
        result = stack.manage("reconcile", "--json")
        reconcile = {"exit_code": result.returncode}
        try:
            reconcile["report"] = json.loads(result.stdout)
        except ValueError:
            reconcile["output"] = (result.stdout + result.stderr)[-2000:]

    truth = collect(
        arm=arm,
        pay_url=pay_url,
        rail_url_db=rail_db,
        payout_ids=payout_ids,
        account_ids=seeded["accounts"],
        run_id=run_id,
    )
    if reconcile is not None:
        reconcile["unexplained_violations"] = unexplained(reconcile, truth, payout_ids)
    # A service restarted between two scrapes loses its counter; the executors' own log lines
    # (one `executor_fenced_out` per fenced write, in files we own) and the proxy's durable
    # FENCED rows don't. Per resource, the largest of the three counts.
    logged = fenced_out_in_logs(logdir) if arm == "fenced" else {}
    fenced_total = dict(fenced_out.total)
    if arm == "fenced":
        fenced_total["rail"] = max(
            fenced_total.get("rail", 0), truth["submission_outcomes"].get("FENCED", 0)
        )
        for resource, n in logged.items():
            fenced_total[resource] = max(fenced_total.get(resource, 0), n)
    posted = truth["by_state"].get("POSTED", 0)
    in_flight = {s: counts.get(s, 0) for s in non_terminal if counts.get(s, 0)}
    return {
        "arm": arm,
        "run_id": run_id,
        "elapsed_s": round(elapsed, 2),
        "throughput_posted_per_s": round(posted / elapsed, 2) if elapsed else 0.0,
        "still_in_flight": in_flight,
        **truth,
        "fenced_out_total": fenced_total if arm == "fenced" else None,
        "fenced_out_sum": sum(fenced_total.values()) if arm == "fenced" else None,
        "fenced_out_scraped": dict(fenced_out.total) if arm == "fenced" else None,
        "fenced_out_executor_logs": logged if arm == "fenced" else None,
        "executor_outcomes": dict(executed.total),
        "reconciler": reconcile,
        "faults": {
            "pauses": [asdict(p) for p in pool.pauses],
            "kills": [owner for _t, owner in pool.kills],
            "worker_exits": pool.exits[:50],
            "errors": errors + rail.errors,
            "notes": notes,
        },
        "windows": windows,
        "series": series,
        "accounts": seeded["accounts"],
    }


REVOKE = "revoke"
NAIVE_REVOKE = "DELETE FROM experiment_naive_lease WHERE lease_key = %s"


def held_lock(arm: str, worker, logdir: Path) -> tuple[str, int | None] | None:
    """The lock a stopped worker holds: the naive worker said so when it stopped; the executor's
    log names the key of its last section and the token it paused with."""
    if arm == "naive":
        return (worker.held_key, None) if worker.held_key else None
    key, token = None, None
    path = logdir / f"{worker.owner_id}.log"
    for line in path.read_text(errors="replace").splitlines() if path.exists() else []:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("event") == "executor_section_started":
            key, token = entry.get("key"), entry.get("token")
    return (key, token) if key else None


def revoke(stack: StackHandle, arm: str, key: str, token: int | None, pay_url: str) -> str:
    """An operator evicts a stuck holder. Fenced: L8 plus the push of the new floor to the
    account fence and the rail high-water (what `manage.py revoke_lock` does, done in-process:
    a fresh manage.py needs ~2 s to start, longer than a CI lease). Naive: delete its lease row.
    Returns a note when there was nothing left to revoke."""
    if arm == "naive":
        with psycopg.connect(pay_url, autocommit=True) as conn:
            conn.execute(NAIVE_REVOKE, (key,))
        return ""
    from dlock.client import FencedOut, LockClient, NotFound
    from ops.revoke import protected_account, push_floor

    client = LockClient(stack.url("lockserver"), owner_id="fencing-experiment")
    try:
        outcome = client.revoke(
            key,
            operator="fencing-experiment",
            reason="holder paused past its lease (injected fault)",
            expected_token=token or None,
        )
    except (FencedOut, NotFound) as exc:
        # The CAS guard: the victim's grant lapsed (and perhaps a rival took the key) before the
        # operator got there — L8 refuses, correctly; a rival's writes fence the victim instead.
        return f"revoke of {key} came after the lease lapsed: {exc.code} {exc.message}"[:200]
    account = protected_account(key)
    if account is not None:
        push_floor(
            account_id=account, floor=int(outcome["newTokenFloor"]), pay_database_url=pay_url
        )
    return ""


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


def unexplained(reconcile: dict, truth: dict, payout_ids: list[str]) -> list:
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


def verdict(results: dict[str, dict]) -> tuple[int, list[str]]:
    """0 = the claim held and the experiment was strong enough; 1 = the fenced arm paid twice or
    broke an invariant; 3 = inconclusive (no stale writer caught, or the naive arm survived)."""
    lines: list[str] = []
    code = 0
    fenced = results.get("fenced")
    if fenced:
        if fenced["duplicates_caused"] or fenced["invariant_violation_count"]:
            code = 1
            lines.append(
                f"FAIL: fenced arm caused {fenced['duplicates_caused']} duplicate payments and"
                f" broke {fenced['invariant_violation_count']} invariants"
            )
        recon = fenced.get("reconciler") or {}
        if recon.get("unexplained_violations"):
            code = 1
            lines.append(
                f"FAIL: the reconciler exited {recon.get('exit_code')} with findings the rail's"
                f" own duplicate acks do not explain: {recon['unexplained_violations'][:3]}"
            )
        elif recon.get("exit_code"):
            lines.append(
                f"note: the reconciler exited {recon['exit_code']}: it flags the rail's own"
                f" duplicate acks ({fenced['rail_duplicate_acks']}) for clawback, as it should"
            )
        if not fenced.get("fenced_out_sum"):
            code = code or 3
            lines.append("INCONCLUSIVE: no stale writer was fenced out (faults too weak)")
        else:
            lines.append(
                f"ok: {int(fenced['fenced_out_sum'])} stale writes fenced out, "
                f"{fenced['duplicates_caused']} duplicates caused"
            )
    naive_arm = results.get("naive")
    if naive_arm:
        if not naive_arm["duplicates_caused"]:
            code = code or 3
            lines.append("INCONCLUSIVE: the naive arm paid nothing twice (faults too weak)")
        else:
            lines.append(
                f"ok: the naive arm paid {naive_arm['duplicates_caused']} payouts more than once"
            )
    return code, lines


def run(
    stack: StackHandle,
    config: ExperimentConfig,
    *,
    progress: Progress = _quiet,
    check: bool = True,
) -> tuple[int, dict]:
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    stack.check_ready()
    schedule = build_schedule(
        seed=config.seed,
        duration=config.duration,
        workers=config.executors,
        lease_ms=config.lease_ms,
        pg_restart=config.pg_restart and stack.pg_cluster is not None,
    )
    if check:
        for arm in config.arms():
            check_commands(stack, arm)
    results: dict[str, dict] = {}
    for arm in config.arms():
        results[arm] = run_arm(arm, stack, config, schedule, progress=progress)
    code, lines = verdict(results)
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(config).items()}
    report = {
        "config": settings,
        "schedule": [e.as_dict() for e in schedule],
        "arms": results,
        "verdict": {"exit_code": code, "lines": lines},
    }
    (out / "report.json").write_text(json.dumps(report, indent=2, default=str))
    try:
        from experiment.chart import draw

        draw(report, out / "report.png")
    except Exception as exc:  # noqa: BLE001 - a missing chart never hides the verdict
        print(f"[experiment] chart not drawn: {exc}", file=sys.stderr)
    return code, report
