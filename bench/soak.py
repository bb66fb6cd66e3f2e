"""`make soak` / `python -m bench.soak`: a long run that measures what grows.

A private stack (bench-style: its own PostgreSQL cluster, fsync off, and the four server roles,
each a pod of gunicorn behind its nginx) and K real executors (`run_executor --concurrency N`)
run for `--minutes` under a steady stream of payouts (`--rate` per second, seeded in-process
every few seconds) or a backlog seeded at the start (`--backlog`), against a rail stub with
faults (latency, failures split between 5xx / drop before / drop after booking, duplicate acks)
and one `pg_ctl restart -m fast` of the cluster at a quarter of the run. Every `--sample-s`
seconds bench.soak_probe samples each process (executors; each role's pod, gunicorn master and
workers, nginx master and workers): RSS, open descriptors, threads; the connections per role
(pg_stat_activity), the rows of every table and the bytes of every log.

Then the seeding stops, the executors drain what is left (`--drain-s`), and the summary
(printed, and written to `<out>/summary.json` and `<out>/summary.md`) says: growth per minute of
every series by a least-squares line over the second half of the load phase (after warm-up);
payouts done; payouts presented to the rail more than once (must be 0); payouts stuck in a
non-terminal state; payouts quarantined (RAIL_AMBIGUOUS) and why (the transition's note and the
reconciler's classification); whether the books balance (experiment.measure's invariants and
`manage.py reconcile`); log bytes per payout per log and the events that take them; CPU per
payout per role. Exit 0 when nothing was presented twice, nothing is stuck and the books
balance; 1 otherwise (growth is reported, not judged: a number for a human).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from bench.proc import role_pids, tree_cpu_seconds
from bench.soak_books import check_books
from bench.soak_heap import HeapWatch, traced_env
from bench.soak_probe import Probe
from bench.soak_report import NON_TERMINAL, markdown, summarise
from devstack.common import PROJECT
from experiment.stack import ROLES, StackHandle, private_stack
from experiment.workers import spawn_executor

BATCH_S = 5.0  # how often the rate mode seeds what is due
AMOUNT_MINOR = 100


def _env(name: str, default: str) -> str:
    return os.environ.get(name) or default


@dataclass
class SoakConfig:
    minutes: float = 12.0
    rate: float = 8.0  # payouts seeded per second (0 with a backlog)
    backlog: int = 0  # payouts seeded at the start instead of a rate
    executors: int = 2
    concurrency: int = 4
    sample_s: float = 10.0
    rail_latency_ms: int = 20
    failure_rate: float = 0.03
    duplicate_ack_rate: float = 0.02
    pg_restart: bool = True
    drain_s: float = 90.0
    tracemalloc: bool = False
    heap_from: float = 0.0  # minutes: the first snapshot (0 = half the run)
    out: Path = PROJECT / ".run" / "soak"

    @property
    def seconds(self) -> float:
        return self.minutes * 60.0


def parse(argv: list[str] | None) -> SoakConfig:
    p = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n")[0])
    p.add_argument("--minutes", type=float, default=float(_env("SOAK_MINUTES", "12")))
    p.add_argument("--rate", type=float, default=float(_env("SOAK_RATE", "8")))
    p.add_argument("--backlog", type=int, default=int(_env("SOAK_BACKLOG", "0")))
    p.add_argument("--executors", type=int, default=int(_env("SOAK_EXECUTORS", "2")))
    p.add_argument("--concurrency", type=int, default=int(_env("SOAK_CONCURRENCY", "4")))
    p.add_argument("--sample-s", type=float, default=float(_env("SOAK_SAMPLE_S", "10")))
    p.add_argument("--rail-latency-ms", type=int, default=20)
    p.add_argument("--failure-rate", type=float, default=0.03)
    p.add_argument("--duplicate-ack-rate", type=float, default=0.02)
    p.add_argument("--no-faults", action="store_true", help="a clean rail, no PostgreSQL restart")
    p.add_argument(
        "--no-pg-restart",
        action="store_true",
        default=_env("SOAK_PG_RESTART", "1") == "0",
        help="no `pg_ctl restart -m fast` at a quarter of the run",
    )
    p.add_argument("--drain-s", type=float, default=90.0)
    p.add_argument(
        "--tracemalloc",
        action="store_true",
        help="trace allocations in every worker and executor (slow): what grew after warm-up",
    )
    p.add_argument(
        "--heap-from", type=float, default=0.0, help="minutes: the first snapshot (default half)"
    )
    p.add_argument("--out", type=Path, default=PROJECT / ".run" / "soak")
    a = p.parse_args(argv)
    if a.minutes <= 0 or a.executors < 1 or a.concurrency < 1 or a.sample_s <= 0:
        p.error("--minutes, --sample-s > 0; --executors, --concurrency >= 1")
    if a.rate <= 0 and a.backlog <= 0:
        p.error("give a --rate > 0 or a --backlog > 0")
    faults = not a.no_faults
    return SoakConfig(
        minutes=a.minutes,
        rate=0.0 if a.backlog else a.rate,
        backlog=a.backlog,
        executors=a.executors,
        concurrency=a.concurrency,
        sample_s=a.sample_s,
        rail_latency_ms=a.rail_latency_ms,
        failure_rate=a.failure_rate if faults else 0.0,
        duplicate_ack_rate=a.duplicate_ack_rate if faults else 0.0,
        pg_restart=faults and not a.no_pg_restart,
        drain_s=a.drain_s,
        tracemalloc=a.tracemalloc,
        heap_from=a.heap_from,
        out=a.out.resolve(),  # nginx resolves a relative log path against its prefix
    )


def setup_django(stack: StackHandle) -> None:
    """The soak seeds payouts and reads the books in-process, on the private stack's databases."""
    for name in ("PAY_DATABASE_URL", "LOCK_DATABASE_URL", "RAIL_DATABASE_URL"):
        os.environ[name] = stack.env[name]
    os.environ["DJANGO_SECRET_KEY"] = stack.env["DJANGO_SECRET_KEY"]
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "settings.tooling")
    import django

    django.setup()


def configure_rail(stack: StackHandle, config: SoakConfig) -> None:
    args = ["railstub_config", "--reset", "--latency-ms", str(config.rail_latency_ms)]
    if config.failure_rate:
        args += ["--failure-rate", str(config.failure_rate), "--hold-ms", "200"]
        args += ["--split-5xx", "1", "--split-drop-before", "1", "--split-drop-after", "1"]
    if config.duplicate_ack_rate:
        args += ["--duplicate-ack-rate", str(config.duplicate_ack_rate)]
    result = stack.manage(*args)
    if result.returncode != 0:
        raise RuntimeError(f"railstub_config failed: {result.stderr[-800:]}")


class Seeder:
    """PENDING payouts in paydb, in-process (payments.seeding): `due` payouts spread over fresh
    accounts, twice what they pay in balance. A batch that meets a restarting database is
    dropped and its payouts are due again at the next one."""

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self.ids: list[str] = []
        self.failed_batches = 0

    def seed(self, due: int) -> None:
        from django.db import Error, connections

        from payments.seeding import seed

        if due <= 0:
            return
        accounts = max(1, min(due, 2 * self.slots))
        per_account = due // accounts
        batches = [(accounts, per_account), (due - accounts * per_account, 1)]  # the remainder
        for n_accounts, n_payouts in batches:
            if n_accounts <= 0:
                continue
            try:
                result = seed(
                    accounts=n_accounts,
                    payouts_per_account=n_payouts,
                    balance_minor=2 * n_payouts * AMOUNT_MINOR,
                    amount_minor=AMOUNT_MINOR,
                )
            except Error:
                self.failed_batches += 1
                connections.close_all()
                return
            self.ids += [str(p) for p in result["payouts"]]


class Executors:
    """K executor processes, each respawned (same owner id and log) if it exits on its own."""

    def __init__(self, stack: StackHandle, config: SoakConfig, logdir: Path) -> None:
        self.spawn = spawn_executor(stack.env, logdir, concurrency=config.concurrency)
        self.owners = [f"soak-e{i}" for i in range(config.executors)]
        self.procs = {owner: self.spawn(owner, None) for owner in self.owners}
        self.respawns = 0
        self.logdir = logdir

    def pids(self) -> dict[str, int]:
        for owner, proc in list(self.procs.items()):
            if proc.poll() is not None:
                self.respawns += 1
                self.procs[owner] = self.spawn(owner, None)
        return {owner: proc.pid for owner, proc in self.procs.items()}

    def cpu_seconds(self) -> float:
        return sum(tree_cpu_seconds(p.pid) for p in self.procs.values())

    def stop(self) -> None:
        for proc in self.procs.values():
            proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(30)
            except Exception:
                proc.kill()
                proc.wait()


def _states(pay_url: str, ids: list[str]) -> dict[str, int]:
    import psycopg

    from payments.selectors import payout_state_counts

    try:
        with psycopg.connect(pay_url, connect_timeout=3) as conn:
            return payout_state_counts(conn.cursor(), payout_ids=ids)
    except psycopg.OperationalError:
        return {}


def _load_phase(stack, config, seeder, executors, probe, samples, t0, heap) -> dict:
    """Seed, sample, restart PostgreSQL once, snapshot the heaps (`heap`, when tracing) at the
    end of warm-up and of the load; returns when the load phase is over."""
    end = t0 + config.seconds
    first = config.heap_from * 60 or config.seconds / 2
    heap_at = [t0 + first, end - 1.0] if heap is not None else []
    next_sample = next_batch = t0
    restart_at = t0 + config.seconds / 4 if config.pg_restart else None
    events: dict = {}
    if config.backlog:
        seeder.seed(config.backlog)
    while (now := time.monotonic()) < end:
        if config.rate and now >= next_batch:
            seeder.seed(int(config.rate * (now - t0 + BATCH_S)) - len(seeder.ids))
            next_batch = now + BATCH_S
        if restart_at is not None and now >= restart_at:
            before = time.monotonic()
            stack.pg_cluster.restart("fast")
            events["pg_restart"] = {
                "at_s": round(before - t0, 1),
                "took_s": round(time.monotonic() - before, 1),
            }
            restart_at = None
        if now >= next_sample:
            samples.append({"t": round(now - t0, 2), **probe.sample()})
            next_sample += config.sample_s
            progress(samples[-1], len(seeder.ids))
        if heap_at and now >= heap_at[0]:
            heap.snapshot()
            heap_at.pop(0)
        executors.pids()
        time.sleep(0.2)
    if heap is not None and heap.taken < 2:
        heap.snapshot()
    return events


def progress(sample: dict, seeded: int) -> None:
    """One line per sample: time, payouts seeded, each executor's RSS and descriptors."""
    executors = sorted({k.split("/")[0] for k in sample if k.startswith("soak-e")})
    parts = [f"{e} {sample.get(e + '/rss_kib', 0) / 1024:.1f} MiB" for e in executors]
    conns = sum(v for k, v in sample.items() if k.startswith("pg/connections/"))
    print(f"[soak] t={sample['t']:.0f}s seeded {seeded}; {', '.join(parts)}; {conns:g} connections",
          flush=True)  # fmt: skip


def _drain(stack, config, seeder, executors, probe, samples, t0) -> dict[str, int]:
    deadline = time.monotonic() + config.drain_s
    states: dict[str, int] = {}
    while time.monotonic() < deadline:
        states = _states(stack.env["PAY_DATABASE_URL"], seeder.ids)
        if states and not any(states.get(s) for s in NON_TERMINAL):
            break
        executors.pids()
        time.sleep(2.0)
    samples.append({"t": round(time.monotonic() - t0, 2), **probe.sample()})
    return states


def run(config: SoakConfig) -> dict:
    config.out.mkdir(parents=True, exist_ok=True)
    started = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    traced = traced_env(config.out / "tracemalloc") if config.tracemalloc else {}
    stack, stop = private_stack(config.out / "stack", extra_env=traced)
    try:
        setup_django(stack)
        configure_rail(stack, config)
        logdir = config.out / "executors"
        logdir.mkdir(exist_ok=True)
        for old in logdir.glob("*.log"):
            old.unlink()
        pods = {role: pid for role, pid in role_pids(stack).items() if role != "postgres"}
        cpu0 = {role: tree_cpu_seconds(pid) for role, pid in pods.items()}
        executors = Executors(stack, config, logdir)
        logs = {role: stack.run_dir / "logs" / f"{role}.log" for role in ROLES}
        logs |= {f"{r}.nginx": stack.run_dir / "logs" / f"{r}.nginx.log" for r in ROLES}
        logs |= {owner: logdir / f"{owner}.log" for owner in executors.owners}
        db_urls = {n: stack.env[f"{n.upper()}_DATABASE_URL"] for n in ("pay", "lock", "rail")}
        probe = Probe(pods=pods, executors=executors.pids, db_urls=db_urls, logs=logs)
        seeder = Seeder(config.executors * config.concurrency)
        heap = HeapWatch(config.out / "tracemalloc", pods, executors.pids) if traced else None
        samples: list[dict] = []
        t0 = time.monotonic()
        try:
            events = _load_phase(stack, config, seeder, executors, probe, samples, t0, heap)
            load_end = time.monotonic() - t0
            if heap is not None:
                events["heap_grown"] = heap.grown()
            states = _drain(stack, config, seeder, executors, probe, samples, t0)
            cpu = {role: tree_cpu_seconds(pid) - cpu0[role] for role, pid in pods.items()}
            cpu["executors"] = executors.cpu_seconds()
        finally:
            executors.stop()
            probe.close()
        events |= {"executor_respawns": executors.respawns, "seed_batches_failed":
                   seeder.failed_batches, "load_s": round(load_end, 1)}  # fmt: skip
        books = check_books(stack, seeder.ids)
        return summarise(
            config, started, samples, load_end, states, books, cpu, logs, events, seeder.ids
        )
    finally:
        stop()


def main(argv: list[str] | None = None) -> int:
    config = parse(argv)
    print(f"[soak] {config.minutes} min, {config.executors} executors × {config.concurrency},"
          f" {'backlog ' + str(config.backlog) if config.backlog else f'{config.rate}/s'}",
          flush=True)  # fmt: skip
    summary = run(config)
    (config.out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    text = markdown(summary)
    (config.out / "summary.md").write_text(text)
    print(text)
    print(f"[soak] wrote {config.out}/summary.json and summary.md")
    ok = not summary["presented_twice"] and not summary["stuck"] and summary["books_balance"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
