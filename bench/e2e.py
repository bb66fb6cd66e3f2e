"""End-to-end payouts/s: the real executors, lock server, payments and rail proxy, rail at zero
latency, on a private durable PostgreSQL cluster (fsync on), with 1, 2 and 4 executors.

Each point seeds fresh accounts (twice as many as executors, so one-lock-per-account does not
serialise them) and payouts, runs the executors with `--until-idle`, and measures from the
database clock: (posted − 1) / (last POSTED event − first POSTED event), so process start-up
is not counted.

Server CPU per payout, by role: a sampler thread reads utime+stime (+ reaped children) of each
gunicorn role's process tree (found by its listening port) and of the PostgreSQL cluster
(postmaster and backends) from /proc every 50 ms; the CPU spent between the first and the last
POSTED event (interpolated between samples) over the payouts posted in that window is the cost
per payout. Executor start-up and shutdown fall outside the window. With
BENCH_E2E_PROFILE=<dir>, py-spy records each role during the 2-executor point
(`<dir>/<role>.txt`, collapsed stacks).
"""

from __future__ import annotations

import bisect
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import psycopg

from bench.proc import listener_root, tree_cpu_seconds
from experiment.runner import ExperimentConfig, seed_fenced
from experiment.stack import ROLES, private_stack
from experiment.workers import spawn_executor

EXECUTORS = tuple(int(k) for k in os.environ.get("BENCH_E2E_EXECUTORS", "1,2,4").split(","))
SAMPLE_S = 0.05
PREVIOUS = {  # issue 18, measured on the `make up` stack before the cuts (2 executors, 96 payouts)
    "cpu_ms_per_payout": {
        "lockserver": 3.8,
        "payments": 6.9,
        "railproxy": 4.5,
        "railstub": 3.8,
        "postgres": 7.3,
        "total": 26.3,
    },
    "payouts_per_s": 40,
}
GOALS = {"cpu_ms_per_payout": 13.0, "payouts_per_s": 100.0, "lock_http_over_floor_8": 0.8}
POSTED_WINDOW = """
SELECT count(*), min(at), max(at) FROM payout_event
 WHERE to_state = 'POSTED' AND payout_id = ANY(%s::uuid[])
"""
STATES = "SELECT state, count(*) FROM payout WHERE payout_id = ANY(%s::uuid[]) GROUP BY state"


def role_pids(stack) -> dict[str, int]:
    """The root process of every server role (by listening port) and the postmaster."""
    pids: dict[str, int] = {}
    for role in ROLES:
        port = urlsplit(stack.url(role)).port
        pid = listener_root(port) if port else None
        if pid is None:
            raise RuntimeError(f"no process listens on {stack.url(role)} ({role})")
        pids[role] = pid
    postmaster = Path(stack.pg_cluster.datadir) / "postmaster.pid"
    pids["postgres"] = int(postmaster.read_text().split()[0])
    return pids


class CpuSampler:
    """(wall time, CPU seconds per role) every SAMPLE_S, from /proc, in a thread."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.times: list[float] = []
        self.samples: list[dict[str, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _take(self) -> None:
        row = {role: tree_cpu_seconds(pid) for role, pid in self.pids.items()}
        self.times.append(time.time())
        self.samples.append(row)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._take()
            self._stop.wait(SAMPLE_S)

    def __enter__(self) -> CpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._take()

    def at(self, when: float) -> dict[str, float]:
        """CPU per role at wall time `when`, linearly interpolated between samples."""
        i = bisect.bisect_left(self.times, when)
        if i <= 0:
            return dict(self.samples[0])
        if i >= len(self.times):
            return dict(self.samples[-1])
        t0, t1 = self.times[i - 1], self.times[i]
        f = (when - t0) / (t1 - t0) if t1 > t0 else 0.0
        a, b = self.samples[i - 1], self.samples[i]
        return {role: a[role] + f * (b[role] - a[role]) for role in a}


def _profilers(pids: dict[str, int], profile_dir: Path | None) -> list[subprocess.Popen]:
    if profile_dir is None:
        return []
    profile_dir.mkdir(parents=True, exist_ok=True)
    py_spy = Path(sys.executable).with_name("py-spy")
    return [
        subprocess.Popen(
            [
                str(py_spy),
                "record",
                "--pid",
                str(pid),
                "--subprocesses",
                "--nonblocking",
                "--gil",
                "--format",
                "raw",
                "--rate",
                "200",
                "-o",
                str(profile_dir / f"{role}.txt"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for role, pid in pids.items()
        if role != "postgres"
    ]


def _point(stack, k: int, per_executor: int, logdir: Path, profile_dir: Path | None = None) -> dict:
    config = ExperimentConfig(executors=k, accounts=2 * k, payouts=per_executor * k)
    seeded = seed_fenced(stack, config)
    ids = seeded["payouts"]
    pids = role_pids(stack)
    profilers = _profilers(pids, profile_dir)
    time.sleep(1.0 if profilers else 0.0)
    sampler = CpuSampler(pids).__enter__()
    load_1m = round(os.getloadavg()[0], 2)
    spawn = spawn_executor(stack.env, logdir)
    procs = [spawn(f"bench-e2e-{k}-{i}", None) for i in range(k)]
    # --until-idle is not passed through spawn: stop them ourselves once nothing is left.
    deadline = time.monotonic() + 300
    pay = stack.env["PAY_DATABASE_URL"]
    states: dict[str, int] = {}
    while time.monotonic() < deadline:
        with psycopg.connect(pay) as conn:
            states = dict(conn.execute(STATES, (ids,)).fetchall())
        if not any(states.get(s) for s in ("PENDING", "CLAIMED", "SUBMITTING", "RAIL_ACKED")):
            break
        time.sleep(0.5)
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    sampler.__exit__(None, None, None)
    for profiler in profilers:
        profiler.send_signal(2)  # SIGINT: py-spy writes its file and exits
    for profiler in profilers:
        try:
            profiler.wait(30)
        except subprocess.TimeoutExpired:
            profiler.kill()
    with psycopg.connect(pay) as conn:
        count, first, last = conn.execute(POSTED_WINDOW, (ids,)).fetchone()
    span = (last - first).total_seconds() if count and count > 1 else 0.0
    cpu: dict[str, float | None] = {}
    if span:
        begin, end = sampler.at(first.timestamp()), sampler.at(last.timestamp())
        cpu = {role: round((end[role] - begin[role]) * 1000 / (count - 1), 2) for role in pids}
        cpu["total"] = round(sum(cpu.values()), 2)
        cores = {role: round((end[role] - begin[role]) / span, 2) for role in pids}
    else:
        cores = {}
    return {
        "executors": k,
        "loadavg_1m_at_start": load_1m,
        "cpu_ms_per_payout": cpu,
        "cores_busy": cores,
        "accounts": 2 * k,
        "payouts": len(ids),
        "posted": count,
        "states": states,
        "window_s": round(span, 3),
        "payouts_per_s": round((count - 1) / span, 2) if span else None,
    }


def run(out_dir: Path, *, per_executor: int = 48, executors: tuple[int, ...] = EXECUTORS) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="dlock-bench-e2e-"))
    base.chmod(0o755)
    logdir = out_dir / "e2e-logs"
    logdir.mkdir(exist_ok=True)
    stack, stop = private_stack(base / "stack", fast=False)
    rows = []
    try:
        result = stack.manage("railstub_config", "--reset")
        if result.returncode != 0:
            raise RuntimeError(f"railstub_config --reset failed: {result.stderr[-500:]}")
        for k in executors:
            profile = os.environ.get("BENCH_E2E_PROFILE")
            profile_dir = Path(profile) if profile and k == 2 else None
            rows.append(_point(stack, k, per_executor, logdir, profile_dir))
    finally:
        stop()
        shutil.rmtree(base, ignore_errors=True)
    data = {
        "name": "e2e",
        "what": "payouts/s end to end (lock → claim → rail proxy → stub → post → release)",
        "rail_latency_ms": 0,
        "durable_cluster": True,
        "cpu_window": "first to last POSTED event; utime+stime of each role's process tree",
        "previous": PREVIOUS,
        "goals": GOALS,
        "rows": rows,
    }
    (out_dir / "e2e.json").write_text(json.dumps(data, indent=2, default=str))
    summary = [
        {
            "label": f"payouts end to end, {r['executors']} executor(s), rail latency 0",
            "value": r["payouts_per_s"],
            "unit": "payouts/s",
            "detail": f"{r['posted']}/{r['payouts']} posted over {r['window_s']} s",
        }
        for r in rows
    ]
    summary += [
        {
            "label": f"server CPU per payout, {r['executors']} executor(s) (goal <= 13, was 26.3)",
            "value": r["cpu_ms_per_payout"].get("total"),
            "unit": "ms",
            "detail": " ".join(
                f"{role} {ms}" for role, ms in r["cpu_ms_per_payout"].items() if role != "total"
            )
            + f"  (load {r['loadavg_1m_at_start']})",
        }
        for r in rows
        if r["cpu_ms_per_payout"]
    ]
    return {**data, "summary": summary}
