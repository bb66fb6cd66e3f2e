"""End-to-end payouts/s and the server CPU per payout: the real executor processes, lock server,
payments, rail proxy and rail stub on a private durable PostgreSQL cluster (fsync on).

The points: ONE `run_executor --concurrency N` process for each N in BENCH_E2E_CONCURRENCY
(default 32) at each rail-stub latency in BENCH_E2E_LATENCIES (ms, default 0): the point
docs/performance.md quotes. Each point seeds fresh accounts (2 per slot: accounts ≥ concurrency)
and enough payouts to fill every slot at least 4 times and to run about BENCH_E2E_POINT_S
seconds (default 8), runs the executor until nothing is left, and measures from the database
clock: (posted − 1) / (last POSTED event − first POSTED event), so process start-up is not
counted.

CPU per payout, by role: a sampler thread reads utime+stime (+ reaped children) of each gunicorn
role's process tree (found by its listening port), of the PostgreSQL cluster (postmaster and
backends) and of each executor process from /proc every 50 ms; the CPU spent between the first
and the last POSTED event (interpolated between samples) over the payouts posted in that window
is the cost per payout, and over the window's length the cores that role kept busy. The
executors' peak RSS is their VmHWM. Each row also has the medians claimed → RAIL_ACKED and
RAIL_ACKED → POSTED from payout_event, and the sections in flight on average between claim and
post. With BENCH_E2E_PROFILE=<dir>, py-spy records each role during the 1 × 32, rail 0 ms
point (`<dir>/<role>.txt`, collapsed stacks).

After the points, on the same stack, the payout floor (`bench/payout_floor.py`, issue 18): every
role as gunicorn + psycopg + the same SQL functions, no Django, at BENCH_FLOOR_CONCURRENCY
clients (default 32), CPU per payout by role as above, with a trivial app's gunicorn cost per
request, in BENCH_FLOOR_ROUNDS rounds (default 3) each after a dlock point of its own at
1 × 32, rail 0 (not in `rows`); `floor` in e2e.json. BENCH_E2E_FLOOR=0 skips it.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psycopg

from bench import e2e_pg
from bench.proc import STATES, CpuSampler, proc_status_kib, py_spy_recorders, role_pids
from experiment.arms.fenced import seed_fenced
from experiment.config import ExperimentConfig
from experiment.stack import private_stack
from experiment.workers import spawn_executor


def _env_ints(name: str, default: str) -> tuple[int, ...]:
    raw = os.environ.get(name, default).strip()
    return tuple(int(v) for v in raw.split(",") if v.strip()) if raw else ()


# ONE executor process at each concurrency × each rail latency (docs/performance.md quotes 32 × 0).
CONCURRENCY = _env_ints("BENCH_E2E_CONCURRENCY", "32")
LATENCIES_MS = _env_ints("BENCH_E2E_LATENCIES", "0")
# A point runs about this long (payouts = expected rate × this), never fewer than 4 per slot.
POINT_S = float(os.environ.get("BENCH_E2E_POINT_S", "8"))
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
# Planning only (how many payouts make a point of about POINT_S seconds): our own hops per
# payout, and the rate no point on this box exceeded.
EXPECTED_OWN_S = 0.1
EXPECTED_CAP_PER_S = 35.0
POINT_TIMEOUT_S = 180.0
PROFILED = (1, 32, 0)  # the point BENCH_E2E_PROFILE records
# Issue 18's payout floor (bench/payout_floor.py) after the points, on the same stack, interleaved
# with dlock points of its own (1 × BENCH_FLOOR_CONCURRENCY, rail 0); 0 skips it.
FLOOR = os.environ.get("BENCH_E2E_FLOOR", "1") not in ("", "0")
GOALS = {"cpu_ms_per_payout": 13.0, "payouts_per_s": 100.0}
POSTED_WINDOW = """
SELECT count(*), min(at), max(at) FROM payout_event
 WHERE to_state = 'POSTED' AND payout_id = ANY(%s::uuid[])
"""
TIMELINE = """
SELECT max(at) FILTER (WHERE to_state = 'CLAIMED'), max(at) FILTER (WHERE to_state = 'RAIL_ACKED'),
       max(at) FILTER (WHERE to_state = 'POSTED')
  FROM payout_event WHERE payout_id = ANY(%s::uuid[]) GROUP BY payout_id
"""


def _planned_payouts(slots: int, latency_ms: int) -> int:
    """Enough payouts to fill every slot several times and to run about POINT_S seconds."""
    expected = min(slots / (latency_ms / 1000 + EXPECTED_OWN_S), EXPECTED_CAP_PER_S)
    return max(4 * slots, 12, int(POINT_S * expected))


def _timeline(pay: str, ids: list[str]) -> dict:
    """Per payout, from payout_event: claimed → rail acked → posted (medians, ms)."""
    with psycopg.connect(pay) as conn:
        rows = conn.execute(TIMELINE, (ids,)).fetchall()
    spans: dict[str, list[float]] = {"claim_to_acked": [], "acked_to_posted": [], "claimed": []}
    for claimed, acked, posted in rows:
        if claimed and acked and posted:
            spans["claim_to_acked"].append((acked - claimed).total_seconds() * 1000)
            spans["acked_to_posted"].append((posted - acked).total_seconds() * 1000)
            spans["claimed"].append((posted - claimed).total_seconds())
    busy_s = sum(spans.pop("claimed"))
    return {
        "median_ms": {k: round(statistics.median(v), 1) if v else None for k, v in spans.items()},
        "claimed_seconds": round(busy_s, 3),
    }


def _until_settled(
    pay: str, ids: list[str], procs: list[subprocess.Popen], deadline: float
) -> tuple[dict[str, int], dict[int, int], int]:
    """Poll the payouts' states until none is in flight (or the deadline): the last states,
    each executor's peak RSS (KiB) and how many polls were made."""
    states: dict[str, int] = {}
    peak_kib: dict[int, int] = {}
    polls = 0
    # One connection for the polls: a connection per poll cost PostgreSQL a backend start-up
    # four times a second, charged to the postgres role.
    with psycopg.connect(pay, autocommit=True) as poll:
        while time.monotonic() < deadline:
            states = dict(poll.execute(STATES, (ids,)).fetchall())
            polls += 1
            for proc in procs:
                peak = proc_status_kib(proc.pid, "VmHWM")
                peak_kib[proc.pid] = peak or peak_kib.get(proc.pid, 0)
            if not any(states.get(s) for s in ("PENDING", "CLAIMED", "SUBMITTING", "RAIL_ACKED")):
                break
            time.sleep(0.25)
    return states, peak_kib, polls


def _stop_all(procs: list[subprocess.Popen], *, signal: int | None = None) -> None:
    """Signal every process (SIGTERM unless `signal`), then wait; kill what does not exit."""
    for proc in procs:
        if signal is None:
            proc.terminate()
        else:
            proc.send_signal(signal)
    for proc in procs:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _cpu_per_payout(
    sampler: CpuSampler, pids: dict[str, int], count: int, first, last
) -> tuple[dict[str, float | None], dict[str, float], float | None]:
    """CPU ms per payout by role, cores each kept busy, and the executors' ms per payout, over
    the window from the first to the last POSTED event (empty with fewer than two)."""
    if not count or count < 2 or last <= first:
        return {}, {}, None
    span = (last - first).total_seconds()
    begin, end = sampler.at(first.timestamp()), sampler.at(last.timestamp())
    used = {role: end[role] - begin[role] for role in begin}
    cpu: dict[str, float | None] = {
        role: round(used[role] * 1000 / (count - 1), 2) for role in pids
    }
    cpu["total"] = round(sum(v for v in cpu.values() if v is not None), 2)
    executor_s = sum(v for role, v in used.items() if role.startswith("executor-"))
    cores = {role: round(used[role] / span, 2) for role in pids}
    cores["executors"] = round(executor_s / span, 2)
    return cpu, cores, round(executor_s * 1000 / (count - 1), 2)


def _seed(stack, *, processes: int, slots: int, ms: int) -> tuple[list[str], int]:
    """The rail stub at `ms` of latency; the point's accounts and payouts seeded (ids, accounts)."""
    accounts = max(2 * slots, 4)
    result = stack.manage("railstub_config", "--reset", "--latency-ms", str(ms))
    if result.returncode != 0:
        raise RuntimeError(f"railstub_config failed: {result.stderr[-500:]}")
    payouts = _planned_payouts(slots, ms)
    config = ExperimentConfig(executors=processes, accounts=accounts, payouts=payouts)
    return seed_fenced(stack, config)["payouts"], accounts


def _point(
    stack,
    *,
    processes: int,
    concurrency: int,
    latency_ms: int,
    logdir: Path,
    profile_dir: Path | None = None,
    executor_env: Callable[[int], dict[str, str]] | None = None,
    extra_pids: dict[str, int] | None = None,
) -> dict:
    """One point; `executor_env(i)`: executor i's own settings, `extra_pids`: more to sample."""
    ids, accounts = _seed(stack, processes=processes, slots=processes * concurrency, ms=latency_ms)
    pids = {**role_pids(stack), **(extra_pids or {})}
    profilers = py_spy_recorders(pids, profile_dir)
    time.sleep(1.0 if profilers else 0.0)
    load_1m = round(os.getloadavg()[0], 2)
    xacts_before = e2e_pg.begin(stack) if e2e_pg.PG_STATS else {}
    spawn = spawn_executor(stack.env, logdir, concurrency=concurrency)
    tag = f"bench-e2e-p{processes}-n{concurrency}-l{latency_ms}"
    procs = [
        spawn(f"{tag}-{i}", None, executor_env(i) if executor_env else None)
        for i in range(processes)
    ]
    pids_all = {**pids, **{f"executor-{i}": p.pid for i, p in enumerate(procs)}}
    sampler = CpuSampler(pids_all, pg_split_user=e2e_pg.BENCH_USER if e2e_pg.PG_STATS else None)
    sampler.__enter__()
    deadline = time.monotonic() + POINT_TIMEOUT_S
    pay = stack.env["PAY_DATABASE_URL"]
    if e2e_pg.PG_STATS:
        pay = e2e_pg.as_bench_user(pay)
    states, peak_kib, polls = _until_settled(pay, ids, procs, deadline)
    _stop_all(procs)
    sampler.__exit__(None, None, None)
    _stop_all(profilers, signal=2)  # SIGINT: py-spy writes its file and exits
    sql = None
    if e2e_pg.PG_STATS:
        posted = states.get("POSTED", 0)
        sql = e2e_pg.end(stack, xacts_before, posted=posted, polls=polls)
    with psycopg.connect(pay) as conn:
        count, first, last = conn.execute(POSTED_WINDOW, (ids,)).fetchone()
    span = (last - first).total_seconds() if count and count > 1 else 0.0
    cpu, cores, executor_cpu_ms = _cpu_per_payout(sampler, pids, count, first, last)
    if span and sql is not None:
        sql["postgres_cpu_ms_by_process"] = sampler.pg_between(
            first.timestamp(), last.timestamp(), payouts=count - 1
        )
    timeline = _timeline(pay, ids)
    # Sections in flight on average, from claimed to posted (lock + claim hops come before).
    in_flight = round(timeline.pop("claimed_seconds") / span, 1) if span else None
    return {
        "processes": processes,
        "executors": processes,  # the issue-18 rows' name for it
        "concurrency": concurrency,
        "rail_latency_ms": latency_ms,
        "loadavg_1m_at_start": load_1m,
        "cpu_ms_per_payout": cpu,
        "executor_cpu_ms_per_payout": executor_cpu_ms,
        "executor_peak_rss_mb": round(max(peak_kib.values(), default=0) / 1024, 1),
        "cores_busy": cores,
        "busiest_role": max(
            (r for r in cores if r != "executors"), key=lambda r: cores[r], default=None
        ),
        "accounts": accounts,
        "payouts": len(ids),
        "posted": count,
        "states": states,
        "window_s": round(span, 3),
        "payouts_per_s": round((count - 1) / span, 2) if span else None,
        "claimed_to_posted_in_flight": in_flight,
        **timeline,
        **({"sql_per_payout": sql} if sql is not None else {}),
    }


def run(out_dir: Path) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="dlock-bench-e2e-"))
    base.chmod(0o755)
    logdir = out_dir / "e2e-logs"
    shutil.rmtree(logdir, ignore_errors=True)
    logdir.mkdir()
    stack, stop = private_stack(
        base / "stack",
        fast=False,
        pg_settings=(
            *(e2e_pg.PG_STATS_SETTINGS if e2e_pg.PG_STATS else ()),
            *e2e_pg.PG_EXTRA_SETTINGS,
        ),
    )
    if e2e_pg.PG_STATS:
        e2e_pg.setup(stack)
    profile = os.environ.get("BENCH_E2E_PROFILE")
    plan = [(1, n, ms) for ms in LATENCIES_MS for n in CONCURRENCY]
    rows = []
    floor: dict | None = None
    try:
        for processes, concurrency, latency_ms in plan:
            profile_dir = None
            if profile and (processes, concurrency, latency_ms) == PROFILED:
                profile_dir = Path(profile)
            row = _point(
                stack,
                processes=processes,
                concurrency=concurrency,
                latency_ms=latency_ms,
                logdir=logdir,
                profile_dir=profile_dir,
            )
            print(
                f"[bench] e2e {processes}×{concurrency} rail {latency_ms} ms:"
                f" {row['payouts_per_s']}/s ({row['posted']}/{row['payouts']} posted,"
                f" cores {row['cores_busy']})",
                flush=True,
            )
            rows.append(row)
        if FLOOR:
            from bench import payout_floor

            def dlock_point() -> dict:
                return _point(
                    stack,
                    processes=1,
                    concurrency=payout_floor.CONCURRENCY,
                    latency_ms=0,
                    logdir=logdir,
                )

            floor = payout_floor.run(
                stack, logdir=logdir, payouts_s=POINT_S, dlock_point=dlock_point
            )
    finally:
        stop()
        shutil.rmtree(base, ignore_errors=True)
    data = {
        "name": "e2e",
        "what": "payouts/s end to end (lock → claim → rail proxy → stub → post → release)",
        "durable_cluster": True,
        "pg_settings": list(e2e_pg.PG_EXTRA_SETTINGS),
        "cpu_window": "first to last POSTED event; utime+stime of each role's process tree",
        "previous": PREVIOUS,
        "goals": GOALS,
        "rows": rows,
        **({"floor": floor} if floor is not None else {}),
    }
    (out_dir / "e2e.json").write_text(json.dumps(data, indent=2, default=str))
    return {**data, "summary": summary(rows)}


def summary(rows: list[dict]) -> list[dict]:
    return [
        {
            "label": f"{r['processes']} process × concurrency {r['concurrency']},"
            f" rail {r['rail_latency_ms']} ms",
            "value": r["payouts_per_s"],
            "unit": "payouts/s",
            "detail": f"{r['posted']}/{r['payouts']} in {r['window_s']} s;"
            f" server {r['cpu_ms_per_payout'].get('total')} ms/payout,"
            f" executor {r['executor_cpu_ms_per_payout']} ms, {r['executor_peak_rss_mb']} MB;"
            " cores "
            + " ".join(f"{role} {c}" for role, c in r["cores_busy"].items())
            + f"; load {r['loadavg_1m_at_start']}",
        }
        for r in rows
    ]
