"""`python -m bench --only scale_payouts`: payouts/s end to end against the lock server's processes
and replicas (issue 39's scale curve, the payouts half; `bench.configs`' `scale` is the pairs half).

The stack is bench.e2e's: the real executor, the four roles behind their nginx, a private durable
PostgreSQL (fsync on), the rail stub at 0 ms. Arms (`ARMS`): the lock server at 1 (the default),
2 and 4 gunicorn processes (`GUNICORN_WORKERS`), and two replicas of one process on its one
database. Everything else is at its defaults, and every arm runs the same executors
(BENCH_SCALE_PAYOUTS_EXECUTORS, `PxN`: P processes × concurrency N, default 2x16: 32 in flight).
Each executor is given every replica's URL (LOCK_SERVER_URL is an endpoint list, ARCHITECTURE
decision 16) starting from a different one: a client sticks to the endpoint that last answered
(failover, not balancing), so executor i starting at replica i is what spreads the load.

BENCH_SCALE_PAYOUTS_ROUNDS rounds (default 3), every arm once per round, the order rotated each
round; a point is bench.e2e's (fresh accounts and payouts, about BENCH_E2E_POINT_S seconds,
payouts/s from the database clock, CPU per payout by role from /proc). An arm's lock-server CPU
is every replica's. Ratios are medians of the per-round ratios to the 1-process arm of the same
round. Writes `<out>/scale_payouts.json`.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from bench import e2e, e2e_pg
from bench.rounds import median, plan
from devstack import RoleProcess, free_port
from experiment.stack import private_stack

# label: (the lock server's GUNICORN_WORKERS, replicas)
ARMS: dict[str, tuple[int, int]] = {
    "pg-w1": (1, 1),
    "pg-w2": (2, 1),
    "pg-w4": (4, 1),
    "pg-w1-r2": (1, 2),
}
BASE = "pg-w1"
ROUNDS = int(os.environ.get("BENCH_SCALE_PAYOUTS_ROUNDS", "3"))
EXECUTORS = os.environ.get("BENCH_SCALE_PAYOUTS_EXECUTORS", "2x16")
LATENCY_MS = 0
ROLES = ("lockserver", "payments", "railproxy", "railstub", "postgres")


def executors(spec: str = EXECUTORS) -> tuple[int, int]:
    """`"2x16"` → (2 processes, concurrency 16)."""
    processes, concurrency = (int(v) for v in spec.lower().split("x"))
    if processes < 1 or concurrency < 1:
        raise ValueError(f"BENCH_SCALE_PAYOUTS_EXECUTORS {spec!r}: P and N must be at least 1")
    return processes, concurrency


def endpoint_lists(urls: list[str], processes: int) -> list[str]:
    """Executor i's LOCK_SERVER_URL: every replica, starting from replica i (mod replicas)."""
    n = len(urls)
    return [",".join(urls[(i + k) % n] for k in range(n)) for i in range(processes)]


def lockserver_cpu(cpu: dict[str, float | None]) -> float | None:
    """The lock server's CPU per payout: every replica's (`lockserver`, `lockserver-2`, …)."""
    own = [v for k, v in cpu.items() if k.startswith("lockserver") and v is not None]
    return round(sum(own), 2) if own else None


def summarise(rounds: list[dict[str, dict]], base: str = BASE) -> dict[str, dict]:
    """Per arm: medians over rounds of payouts/s and CPU per payout by role, and the medians of
    the per-round ratios to `base` (payouts/s, server CPU per payout)."""
    out: dict[str, dict] = {}
    arms = list(rounds[0]) if rounds else []
    for arm in arms:
        rows = [one[arm] for one in rounds if arm in one]
        rate = [r["payouts_per_s"] for r in rows if r.get("payouts_per_s")]
        over_rate, over_cpu = [], []
        for one in rounds:
            row, ref = one.get(arm), one.get(base)
            if row and ref and row.get("payouts_per_s") and ref.get("payouts_per_s"):
                over_rate.append(row["payouts_per_s"] / ref["payouts_per_s"])
            total, ref_total = _total(row), _total(ref)
            if total and ref_total:
                over_cpu.append(total / ref_total)
        cpu = {role: median([v for r in rows if (v := _role_cpu(r, role))]) for role in ROLES}
        out[arm] = {
            "payouts_per_s": median(rate),
            "over_base": {"payouts_per_s": median(over_rate), "server_cpu": median(over_cpu)},
            "server_cpu_ms_per_payout": median([t for t in map(_total, rows) if t]),
            "cpu_ms_per_payout": cpu,
            "lockserver_cores": median([_cores(r) for r in rows if _cores(r) is not None]),
            "rounds": len(rows),
        }
    return out


def _total(row: dict | None) -> float | None:
    return (row or {}).get("cpu_ms_per_payout", {}).get("total")


def _role_cpu(row: dict, role: str) -> float | None:
    cpu = row.get("cpu_ms_per_payout") or {}
    return lockserver_cpu(cpu) if role == "lockserver" else cpu.get(role)


def _cores(row: dict) -> float | None:
    own = [v for k, v in (row.get("cores_busy") or {}).items() if k.startswith("lockserver")]
    return round(sum(own), 2) if own else None


def table(summary: dict[str, dict]) -> list[str]:
    head = " ".join(f"{r[:9]:>9}" for r in ROLES)
    lines = [f"{'arm':<10} {'payouts/s':>9} {'÷1 proc':>7} {'CPU ms':>7} {head} {'ls cores':>8}"]
    for arm, s in summary.items():
        by_role = " ".join(f"{s['cpu_ms_per_payout'].get(r) or '':>9}" for r in ROLES)
        lines.append(
            f"{arm:<10} {s['payouts_per_s'] or '':>9} {s['over_base']['payouts_per_s'] or '':>7}"
            f" {s['server_cpu_ms_per_payout'] or '':>7} {by_role} {s['lockserver_cores'] or '':>8}"
        )
    return lines


class LockServers:
    """The stack's lock server restarted with an arm's GUNICORN_WORKERS, and the second replica
    (one process, the stack's environment: the same database) started only for a replicated arm."""

    def __init__(self, stack, logdir: Path) -> None:
        self.stack = stack
        self.logdir = logdir
        self.workers: int | None = None
        self.replicas: list[RoleProcess] = []

    def arm(self, workers: int, replicas: int) -> list[str]:
        """Switch to the arm; the lock servers' URLs, the stack's first."""
        if workers != self.workers:
            self.stack.restart_role("lockserver", env={"GUNICORN_WORKERS": str(workers)})
            self.workers = workers
        while len(self.replicas) > replicas - 1:
            self.replicas.pop().stop()
        while len(self.replicas) < replicas - 1:
            name = f"lockserver-{len(self.replicas) + 2}"
            env = {**self.stack.env, "GUNICORN_WORKERS": "1"}
            server = RoleProcess("lockserver", free_port(), env, self.logdir / f"{name}.log")
            server.name = name
            self.replicas.append(server.start())
        return [self.stack.url("lockserver"), *(r.url for r in self.replicas)]

    def extra_pids(self) -> dict[str, int]:
        return {r.instance: r.process.pid for r in self.replicas if r.process is not None}

    def stop(self) -> None:
        while self.replicas:
            self.replicas.pop().stop()


def _rounds(stack, logdir: Path) -> list[dict[str, dict]]:
    processes, concurrency = executors()
    servers = LockServers(stack, logdir)
    rounds: list[dict[str, dict]] = []
    try:
        for index, order in enumerate(plan(list(ARMS), ROUNDS)):
            one: dict[str, dict] = {}
            for arm in order:
                urls = servers.arm(*ARMS[arm])
                lists = endpoint_lists(urls, processes)
                row = e2e._point(
                    stack,
                    processes=processes,
                    concurrency=concurrency,
                    latency_ms=LATENCY_MS,
                    logdir=logdir,
                    executor_env=lambda i, lists=lists: {"LOCK_SERVER_URL": lists[i]},
                    extra_pids=servers.extra_pids(),
                )
                row["lock_server_urls"] = lists
                one[arm] = row
                print(
                    f"[bench] scale_payouts round {index + 1} {arm}: {row['payouts_per_s']}/s"
                    f" ({row['posted']}/{row['payouts']}), server"
                    f" {row['cpu_ms_per_payout'].get('total')} ms/payout,"
                    f" lock server {lockserver_cpu(row['cpu_ms_per_payout'])} ms,"
                    f" load {row['loadavg_1m_at_start']}",
                    flush=True,
                )
            rounds.append({arm: one[arm] for arm in ARMS if arm in one})
    finally:
        servers.stop()
    return rounds


def run(out_dir: str | Path = ".run/bench") -> dict:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="dlock-bench-scale-payouts-"))
    base.chmod(0o755)
    logdir = out / "scale_payouts-logs"
    shutil.rmtree(logdir, ignore_errors=True)
    logdir.mkdir()
    stack, stop = private_stack(base / "stack", fast=False, pg_settings=e2e_pg.PG_EXTRA_SETTINGS)
    loads = [round(os.getloadavg()[0], 2)]
    try:
        rounds = _rounds(stack, logdir)
    finally:
        stop()
        shutil.rmtree(base, ignore_errors=True)
    loads.append(round(os.getloadavg()[0], 2))
    by_arm = summarise(rounds)
    data = {
        "name": "scale_payouts",
        "what": "payouts/s end to end against the lock server's processes and replicas",
        "executors": EXECUTORS,
        "rail_latency_ms": LATENCY_MS,
        "arms": {arm: {"GUNICORN_WORKERS": w, "replicas": r} for arm, (w, r) in ARMS.items()},
        "loadavg_1m": loads,
        "by_arm": by_arm,
        "table": table(by_arm),
        "rounds": rounds,
    }
    (out / "scale_payouts.json").write_text(json.dumps(data, indent=2, default=str) + "\n")
    print("\n".join(data["table"]), flush=True)
    return data
