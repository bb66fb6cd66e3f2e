"""One arm of the fencing experiment under the fault schedule (`ArmRun`).

Seed the workload → set the rail to its base config → start K workers → replay the fault
schedule for `duration` seconds (sampling states and /metrics as it goes) → heal every fault →
drain until no payout is in flight (or the drain deadline) → stop the workers → the arm's own
summary → read the ground truth (`experiment.measure.collect`). What differs between the arms
lives behind `experiment.arms.Arm`; this module never asks which.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path

from experiment import ha, probes, recovery
from experiment.arms import Arm, ArmContext
from experiment.config import ExperimentConfig
from experiment.fenced_outs import Fault
from experiment.measure import (
    CounterScraper,
    claimable_elsewhere,
    collect,
    posted_times,
    state_counts,
)
from experiment.rail import HOLD_MS, RailConfigurator
from experiment.report import shared_rates_line
from experiment.schedule import (
    HA_FAULTS,
    KILL,
    PAUSE,
    PG_RESTART,
    RAIL_WINDOWS,
    RESTART,
    FaultEvent,
    overlapping,
    rail_config_at,
)
from experiment.stack import MissingPiece, StackHandle
from experiment.workers import WorkerPool, proc_state

REVOKE = "revoke"

Progress = Callable[[str, float, dict[str, int], dict[str, float], str], None]


def quiet(*_args: object) -> None:
    return None


def lock_backend(stack: StackHandle) -> str:
    """The lock backend the stack was started with (`LOCK_BACKEND` in its env; pg by default)."""
    return stack.env.get("LOCK_BACKEND") or "pg"


class ArmRun:
    """One arm under the schedule. `run()` returns the arm's part of the report."""

    def __init__(
        self,
        arm: Arm,
        stack: StackHandle,
        config: ExperimentConfig,
        schedule: list[FaultEvent],
        *,
        progress: Progress = quiet,
    ) -> None:
        self.arm = arm
        self.stack = stack
        self.config = config
        self.schedule = schedule
        self.progress = progress
        out = Path(config.out)
        self.ctx = ArmContext(stack, config, f"{config.run_id}-{arm.name}", out / "logs" / arm.name)
        self.pay_url = stack.env["PAY_DATABASE_URL"]
        self.executed = CounterScraper("payout_execute_total", "outcome")
        self.windows: list[dict] = []
        self.threads: list[threading.Thread] = []
        self.errors: list[str] = []
        self.notes: list[str] = []
        self.series: list[dict] = []
        self.counts: dict[str, int] = {}
        self.fenced_so_far: dict[str, float] = {}
        self.label = "warming up"
        self.stopping = False
        self.revokes: list[tuple[FaultEvent, str]] = []  # (event, victim owner) awaiting its stop
        self.t0 = time.monotonic()
        self.probers: list[probes.Prober] = []
        self.last_ha_end = 0.0  # when the latest HA fault healed (the recovery run's settle)
        self.leftovers = 0  # claimable payouts of earlier runs on this stack when it began
        # Faults that run in the background until healed: kind -> action(event, mark).
        self.actions = ha.fault_actions(stack)

    def clock(self) -> float:
        return time.monotonic() - self.t0

    # -- the run --------------------------------------------------------------------------
    def run(self) -> dict:
        self.ctx.logdir.mkdir(parents=True, exist_ok=True)
        # The logs are this run's evidence (fenced-outs are read back from them) and the workers
        # append to `<owner>.log`: a previous run's lines under the same owner ids must go.
        for old in self.ctx.logdir.glob("*.log"):
            old.unlink()
        self.rail = RailConfigurator(self.stack)
        self.rail.reset(seed=self.config.seed, hold_ms=HOLD_MS)
        self.rail.want(rail_config_at([], 0, base_latency_ms=self.config.base_latency))
        self.rail.settle()
        if self.rail.errors:
            raise MissingPiece(
                f"the rail stub's config row could not be written:\n{self.rail.errors[-1]}"
            )
        self.seeded = self.arm.seed(self.ctx)
        self.ctx.payout_ids = self.seeded["payouts"]
        if self.arm.name == "fenced":
            self.leftovers = claimable_elsewhere(self.pay_url, self.ctx.payout_ids)
            shared = shared_rates_line(self.arm.name, {"earlier_runs_claimable": self.leftovers})
            if shared:
                print(f"[experiment] warning: {shared}", file=sys.stderr)
        spawn = self.arm.spawner(self.ctx)
        self.arm.start_sampling(self.ctx)
        self.t0 = time.monotonic()
        self.ctx.wall0 = time.time()
        self.pool = WorkerPool(self.arm.name, self.config.executors, spawn, self.clock)
        self.pool.start()
        self._start_probers()
        sampling = threading.Thread(target=self._sampler, daemon=True)
        sampling.start()
        try:
            self._fault_phase()
            self._heal_and_drain()
        finally:
            for prober in self.probers:
                prober.stop()
            self.pool.stop_all(timeout=8)
            self.rail.close()
            self.stopping = True
            sampling.join(10)
        self.label = "done"
        with contextlib.suppress(Exception):  # reported below from the databases anyway
            self._sample_states()
        return self._result()

    def _start_probers(self) -> None:
        """HA runs: a prober per replica of every role, plus one per role with every URL."""
        if not (self.config.ha and self.arm.name == "fenced"):
            return
        self.probers = probes.build_probers(
            self.stack.env,
            run_id=self.ctx.run_id,
            account_id=self.seeded["accounts"][0],
            clock=self.clock,
        )
        for prober in self.probers:
            prober.start()

    def _ha_busy(self) -> bool:
        """An HA fault is still healing, or healed less than its settle period ago."""
        running = any(w["kind"] in HA_FAULTS and w["end"] is None for w in self.windows)
        return running or self.clock() < self.last_ha_end + self.config.settle_s

    def _pauses_unlanded(self, pending: list[FaultEvent]) -> bool:
        """A run whose pauses must land: some scheduled pause has not landed and ended yet, and
        there is still work it can land on (within `land_timeout` after the fault phase)."""
        if not self.config.pauses_must_land:
            return False
        if self.clock() >= self.config.duration + self.config.land_timeout:
            return False
        waiting = any(e.kind == PAUSE for e in pending) or any(
            w.pause_requested_at is not None or w.stopped_at is not None
            for w in self.pool.workers.values()
        )
        work_left = not self.series or any(self.counts.get(s, 0) for s in self.arm.non_terminal)
        return waiting and work_left

    def _fault_phase(self) -> None:
        pending = list(self.schedule)
        # The recovery run goes on until its last fault has healed and settled.
        settling = any(e.params.get("settle") for e in self.schedule)
        while (
            self.clock() < self.config.duration
            or (settling and (pending or self._ha_busy()))
            or self._pauses_unlanded(pending)
        ):
            now = self.clock()
            deferred = []
            while pending and pending[0].at <= now:
                event = pending.pop(0)
                self.label = f"{event.kind} {event.target}".strip()
                if not self._inject(event, now):
                    deferred.append(event)  # rivals first: retried once a pause ends
            for event in deferred:
                pending.insert(0, replace(event, at=now + 0.5))
            pending.sort(key=lambda e: e.at)
            self.rail.want(
                rail_config_at(self.schedule, now, base_latency_ms=self.config.base_latency)
            )
            self.pool.tick()
            self._revoke_when_stopped()
            time.sleep(0.05)
        for event in pending:  # deferred past the end (a short run): said, never hidden
            self.notes.append(
                f"not injected, the fault phase ended first: {event.kind} {event.target}".strip()
                + f" (planned @{event.at:.1f}s)"
            )

    def _inject(self, event: FaultEvent, now: float) -> bool:
        """Start one fault; False when it must wait (a pause needs a running rival)."""
        if event.kind == PAUSE:
            if not self.pool.pause(int(event.target), event.params["phase"], event.seconds):
                return False
            if event.params.get("revoke"):
                victim = self.pool.workers[int(event.target) % self.pool.size]
                self.revokes.append((event, self.pool.last_paused or victim.owner_id))
        elif event.kind == KILL:
            self.pool.kill(int(event.target))
            self.windows.append({"kind": KILL, "target": event.target, "start": now, "end": now})
        elif event.kind in self.actions:
            if event.params.get("settle") and self._ha_busy():
                return False  # the recovery run: one fault at a time, each after a settle
            if event.scope and any(
                w.get("scope") == event.scope and w["end"] is None for w in self.windows
            ):
                return False  # never two faults on one role (etcd, postgres) at once
            record: dict = {}

            def mark(what: str, record: dict = record) -> None:
                record[what] = self.clock()

            self._background(event, lambda e=event, m=mark: self.actions[e.kind](e, m), record)
        return True  # rail windows are applied by the loop, from the schedule

    def _heal_and_drain(self) -> None:
        """The rail behaves, everyone stopped runs again, every restarted piece is back; then
        drain. A pause already armed may still land in the drain; tick() resumes it on time."""
        self.label = "healing + draining"
        self.rail.want(rail_config_at([], 0, base_latency_ms=0))
        self.pool.fallback = False
        for thread in self.threads:
            thread.join(90)
        self.stack.wait_ready(60)
        drain_start = self.clock()
        while self.clock() - drain_start < self.config.drain_timeout:
            self.pool.tick()
            if len(self.series) > 2 and not any(
                self.counts.get(s, 0) for s in self.arm.non_terminal
            ):
                break
            time.sleep(0.1)
        self.elapsed = self.clock()

    # -- background work ------------------------------------------------------------------
    def _background(
        self, event: FaultEvent, action: Callable[[], object], record: dict | None = None
    ) -> None:
        """Run a fault's action in a thread; `record` (its window in the report) gets the times."""
        record = record if record is not None else {}
        record.update(
            kind=event.kind, target=event.target, scope=event.scope, start=self.clock(), end=None
        )
        self.windows.append(record)

        def run() -> None:
            try:
                outcome = action()
                if isinstance(outcome, dict):
                    record["outcome"] = outcome  # e.g. what `make up` replaced after a pg kill
            except Exception as exc:
                self.errors.append(f"{event.kind} {event.target}: {exc}")
            finally:
                record["end"] = self.clock()
                if event.kind in HA_FAULTS:
                    self.last_ha_end = record["end"]

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        self.threads.append(thread)

    def _sample_states(self) -> None:
        self.counts = state_counts(
            self.pay_url,
            arm=self.arm.name,
            payout_ids=self.ctx.payout_ids,
            run_id=self.ctx.run_id,
        )
        now = self.clock()
        self.series.append({"t": round(now, 2), **self.counts})
        self.progress(self.arm.name, now, self.counts, self.fenced_so_far, self.label)

    def _sampler(self) -> None:
        """States every 0.5 s, /metrics every 1 s — in the background, so a slow or paused
        endpoint never delays a fault."""
        last_scrape = -1.0
        while not self.stopping:
            now = self.clock()
            if now - last_scrape >= 1.0:
                last_scrape = now
                self.fenced_so_far = self.arm.sample(self.ctx)
                for worker in list(self.pool.workers.values()):
                    if worker.metrics_port and proc_state(worker.process.pid) not in ("", "T"):
                        url = f"http://127.0.0.1:{worker.metrics_port}"
                        self.executed.scrape(worker.owner_id, url)
            try:
                self._sample_states()
            except Exception:
                time.sleep(0.5)
                continue
            time.sleep(max(0.0, 0.5 - (self.clock() - now)))

    def _revoke_when_stopped(self) -> None:
        for item in list(self.revokes):
            event, owner = item
            worker = next((w for w in self.pool.workers.values() if w.owner_id == owner), None)
            if worker is None:
                self.revokes.remove(item)  # killed or replaced first: nothing to revoke
                continue
            if worker.stopped_at is None:
                continue
            self.revokes.remove(item)
            held = self.arm.held_lock(self.ctx, worker)
            if held is None:  # stopped from outside, between sections: nothing to revoke
                self.notes.append(f"revoke skipped: {owner} held no lock when it stopped")
                continue
            key, token = held

            record = {
                "token": token,
                "owner": owner,
                "revoked": True,
                "phase": event.params.get("phase", ""),
            }

            def evict(key: str = key, token: int | None = token, record: dict = record) -> None:
                outcome = self.arm.revoke(self.ctx, key=key, token=token, owner=record["owner"])
                if outcome:
                    self.notes.append(outcome)
                    record["revoked"] = False  # L8 refused: nothing was revoked

            self._background(replace(event, kind=REVOKE, target=key), evict, record)

    # -- the report -----------------------------------------------------------------------
    def _closed_windows(self) -> list[dict]:
        elapsed = self.elapsed
        windows = [dict(w, end=elapsed if w["end"] is None else w["end"]) for w in self.windows]
        for record in self.pool.pauses:
            windows.append(
                {
                    "kind": PAUSE,
                    "target": record.worker,
                    "phase": record.phase,
                    "start": record.start,
                    "end": record.end if record.end is not None else elapsed,
                }
            )
        for event in self.schedule:
            if event.kind in RAIL_WINDOWS:
                windows.append(
                    {
                        "kind": event.kind,
                        "target": json.dumps(event.params),
                        "start": event.at,
                        "end": event.at + event.seconds,
                    }
                )
        return windows

    def faults(self, windows: list[dict]) -> list[Fault]:
        """The faults as really injected, for the fenced-out classifier."""
        faults = []
        for w in windows:
            if w["kind"] == REVOKE and not w.get("revoked", True):
                continue  # L8 refused (the lease had lapsed): the rival's fence did the work
            faults.append(
                Fault(
                    kind=w["kind"],
                    start=float(w["start"]),
                    end=float(w["end"]),
                    owner=str(w["target"]) if w["kind"] == PAUSE else "",
                    key=str(w["target"]) if w["kind"] == REVOKE else "",
                    token=w.get("token") if w["kind"] == REVOKE else None,
                    target=str(w["target"]),
                    phase=str(w.get("phase") or ""),
                )
            )
        faults += [Fault(kind=KILL, start=t, end=t, owner=owner) for t, owner in self.pool.kills]
        return faults

    def _recovery(self, windows: list[dict]) -> list[dict]:
        """Per service fault (HA faults, restarts, kills): seconds until the next POSTED payout."""
        kinds = (*HA_FAULTS, RESTART, PG_RESTART, KILL)
        return [
            {
                "kind": w["kind"],
                "target": w["target"],
                "start": round(w["start"], 2),
                "next_posted_after_s": ha.time_to_next_posted(self.series, w["start"]),
            }
            for w in sorted(windows, key=lambda w: w["start"])
            if w["kind"] in kinds
        ]

    def _ha_recovery(self, windows: list[dict]) -> list[dict]:
        """Per HA fault, per prober: outage until acquires (calls) succeed again; payouts/s."""
        if not self.probers:
            return []
        posted = [t - self.ctx.wall0 for t in posted_times(self.pay_url, self.ctx.payout_ids)]
        return recovery.fault_recovery(
            windows,
            {p.name: p.attempts for p in self.probers},
            posted,
            settle_s=self.config.settle_s,
            executor_logs=recovery.executor_log_lines(self.ctx.logdir, wall0=self.ctx.wall0),
        )

    def _result(self) -> dict:
        windows = self._closed_windows()
        truth = collect(
            arm=self.arm.name,
            pay_url=self.pay_url,
            rail_url_db=self.stack.env["RAIL_DATABASE_URL"],
            payout_ids=self.ctx.payout_ids,
            account_ids=self.seeded["accounts"],
            run_id=self.ctx.run_id,
        )
        own = self.arm.summarise(
            self.ctx, truth=truth, faults=self.faults(windows), kills=len(self.pool.kills)
        )
        posted = truth["by_state"].get("POSTED", 0)
        in_flight = {s: n for s in self.arm.non_terminal if (n := self.counts.get(s, 0))}
        elapsed = self.elapsed
        return {
            "arm": self.arm.name,
            "run_id": self.ctx.run_id,
            "lock_backend": lock_backend(self.stack),
            "elapsed_s": round(elapsed, 2),
            "throughput_posted_per_s": round(posted / elapsed, 2) if elapsed else 0.0,
            "still_in_flight": in_flight,
            "earlier_runs_claimable": self.leftovers,
            **truth,
            **own,
            "executor_outcomes": dict(self.executed.total),
            "faults": {
                "pauses": [asdict(p) for p in self.pool.pauses],
                "kills": [owner for _t, owner in self.pool.kills],
                "worker_exits": self.pool.exits[:50],
                "errors": self.errors + self.rail.errors,
                "notes": self.notes,
            },
            "windows": windows,
            "double_faults": overlapping(windows),
            "pauses_landed": landed_pauses(self.pool.pauses),
            "recovery": self._recovery(windows),
            "ha_recovery": self._ha_recovery(windows),
            "probes": {
                p.name: {
                    "attempts": len(p.attempts),
                    "failed": [a.as_dict() for a in p.attempts if not a.ok],
                }
                for p in self.probers
            },
            "series": self.series,
            "accounts": self.seeded["accounts"],
        }


def landed_pauses(pauses: list) -> dict:
    """The pauses that landed (the worker stopped, then resumed), counted per phase."""
    by_phase: dict[str, int] = {}
    for record in pauses:
        if record.end is not None:
            by_phase[record.phase] = by_phase.get(record.phase, 0) + 1
    return {"total": sum(by_phase.values()), "by_phase": by_phase}
