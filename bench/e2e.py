"""End-to-end payouts/s (issue 17's matrix and issue 18's CPU per payout): the real executor
processes, lock server, payments, rail proxy and rail stub on a private durable PostgreSQL
cluster (fsync on).

The matrix: ONE `run_executor --concurrency N` process for each N in BENCH_E2E_CONCURRENCY
(default 1,8,32,64) at each rail-stub latency in BENCH_E2E_LATENCIES (ms, default 0,200,1000),
then, at rail latency 0, the `PxN` points of BENCH_E2E_MULTI (default 2x32,4x16: P processes ×
concurrency N), so "one process within 0.8× of the best any number of processes reaches" is
decided within one run. An empty variable skips that part. Each point seeds fresh accounts (2 per
slot: accounts ≥ concurrency) and enough payouts to fill every slot at least 4 times and to run
about BENCH_E2E_POINT_S seconds (default 8), runs the executors until nothing is left, and
measures from the database clock: (posted − 1) / (last POSTED event − first POSTED event), so
process start-up is not counted.

CPU per payout, by role: a sampler thread reads utime+stime (+ reaped children) of each gunicorn
role's process tree (found by its listening port), of the PostgreSQL cluster (postmaster and
backends) and of each executor process from /proc every 50 ms; the CPU spent between the first
and the last POSTED event (interpolated between samples) over the payouts posted in that window
is the cost per payout, and over the window's length the cores that role kept busy. The
executors' peak RSS is their VmHWM. Each row also has the medians claimed → RAIL_ACKED and
RAIL_ACKED → POSTED from payout_event, and the sections in flight on average between claim and
post. With BENCH_E2E_PROFILE=<dir>, py-spy records each role during the 1 × 32, rail 200 ms
point (`<dir>/<role>.txt`, collapsed stacks).

After the points, on the same stack, the payout floor (`bench/payout_floor.py`, issue 18): every
role as gunicorn + psycopg + the same SQL functions, no Django, at BENCH_FLOOR_CONCURRENCY
clients (default 32), CPU per payout by role as above, with a trivial app's gunicorn cost per
request, in BENCH_FLOOR_ROUNDS rounds (default 3) each after a dlock point of its own at
1 × 32, rail 0 (not in `rows`); `floor` in e2e.json. BENCH_E2E_FLOOR=0 skips it.
"""

from __future__ import annotations

import bisect
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import psycopg

from bench import e2e_pg
from bench.proc import PgSplit, proc_status_kib, py_spy_recorders, role_root, tree_cpu_seconds
from experiment.runner import ExperimentConfig, seed_fenced
from experiment.stack import ROLES, private_stack
from experiment.workers import spawn_executor


def _env_ints(name: str, default: str) -> tuple[int, ...]:
    raw = os.environ.get(name, default).strip()
    return tuple(int(v) for v in raw.split(",") if v.strip()) if raw else ()


# ONE executor process at each concurrency × each rail latency (issue 17's matrix) …
CONCURRENCY = _env_ints("BENCH_E2E_CONCURRENCY", "1,8,32,64")
LATENCIES_MS = _env_ints("BENCH_E2E_LATENCIES", "0,200,1000")
# … and, at rail latency 0, several processes (so "within 0.8× of the best any number of
# processes reaches" is computed in the same run): `processes×concurrency` pairs.
MULTI = tuple(
    tuple(int(v) for v in pair.split("x"))
    for pair in os.environ.get("BENCH_E2E_MULTI", "2x32,4x16").split(",")
    if pair.strip()
)
# A point runs about this long (payouts = expected rate × this), never fewer than 4 per slot.
POINT_S = float(os.environ.get("BENCH_E2E_POINT_S", "8"))
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
GOALS_17 = {"one_process_200ms": 80.0, "one_over_best_0ms": 0.8}
# Planning only (how many payouts make a point of about POINT_S seconds): our own hops per
# payout, and the rate no point on this box exceeded.
EXPECTED_OWN_S = 0.1
EXPECTED_CAP_PER_S = 35.0
POINT_TIMEOUT_S = 180.0
PROFILED = (1, 32, 200)  # the point BENCH_E2E_PROFILE records
# Issue 18's payout floor (bench/payout_floor.py) after the points, on the same stack, interleaved
# with dlock points of its own (1 × BENCH_FLOOR_CONCURRENCY, rail 0); 0 skips it.
FLOOR = os.environ.get("BENCH_E2E_FLOOR", "1") not in ("", "0")
GOALS = {"cpu_ms_per_payout": 13.0, "payouts_per_s": 100.0, "lock_http_over_floor_8": 0.8}
POSTED_WINDOW = """
SELECT count(*), min(at), max(at) FROM payout_event
 WHERE to_state = 'POSTED' AND payout_id = ANY(%s::uuid[])
"""
TIMELINE = """
SELECT max(at) FILTER (WHERE to_state = 'CLAIMED'), max(at) FILTER (WHERE to_state = 'RAIL_ACKED'),
       max(at) FILTER (WHERE to_state = 'POSTED')
  FROM payout_event WHERE payout_id = ANY(%s::uuid[]) GROUP BY payout_id
"""
STATES = "SELECT state, count(*) FROM payout WHERE payout_id = ANY(%s::uuid[]) GROUP BY state"


def role_pids(stack) -> dict[str, int]:
    """The root process of every server role (by listening port; its pod when the role runs
    behind its own proxy, so the proxy's CPU is the role's too) and the postmaster."""
    pids: dict[str, int] = {}
    for role in ROLES:
        port = urlsplit(stack.url(role)).port
        pid = role_root(port) if port else None
        if pid is None:
            raise RuntimeError(f"no process listens on {stack.url(role)} ({role})")
        pids[role] = pid
    postmaster = Path(stack.pg_cluster.datadir) / "postmaster.pid"
    pids["postgres"] = int(postmaster.read_text().split()[0])
    return pids


class CpuSampler:
    """(wall time, CPU seconds per role) every SAMPLE_S, from /proc, in a thread."""

    def __init__(self, pids: dict[str, int], *, pg_split: bool = False) -> None:
        self.pids = pids
        self.times: list[float] = []
        self.samples: list[dict[str, float]] = []
        # BENCH_E2E_PG_STATS: PostgreSQL's processes by kind, user and system apart.
        self._split = PgSplit(pids["postgres"], bench_user=e2e_pg.BENCH_USER) if pg_split else None
        self.pg_samples: list[dict] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _take(self) -> None:
        row = {role: tree_cpu_seconds(pid) for role, pid in self.pids.items()}
        if self._split is not None:
            self.pg_samples.append(self._split.sample())
        self.times.append(time.time())
        self.samples.append(row)

    def pg_between(self, first: float, last: float, *, payouts: int) -> dict:
        """PostgreSQL's CPU ms per payout by process kind (user / system) between two wall
        times (the nearest samples inside the window)."""
        i = min(bisect.bisect_left(self.times, first), len(self.times) - 1)
        j = max(bisect.bisect_right(self.times, last) - 1, i)
        split = PgSplit.between(self.pg_samples[i], self.pg_samples[j])
        span = max(self.times[j] - self.times[i], 1e-9)
        # Samples nearest the window, not interpolated: scale to the window's payouts.
        scale = 1000 * ((last - first) / span) / max(payouts, 1)
        out = {
            kind: {k: round(v * scale, 3) for k, v in row.items()}
            for kind, row in sorted(split.items())
        }
        out["total"] = {
            k: round(sum(row[k] for row in split.values()) * scale, 3) for k in ("user", "system")
        }
        return out

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
    sampler = CpuSampler(pids_all, pg_split=e2e_pg.PG_STATS)
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
    plan += [(p, n, 0) for p, n in MULTI]
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
        "goals_17": GOALS_17,
        "verdict_17": verdict_17(rows),
        "rows": rows,
        **({"floor": floor} if floor is not None else {}),
    }
    (out_dir / "e2e.json").write_text(json.dumps(data, indent=2, default=str))
    return {**data, "summary": summary(rows, data["verdict_17"])}


def verdict_17(rows: list[dict]) -> dict:
    """Issue 17's two goals from this run's rows (None where the run lacked the points)."""
    one = [r for r in rows if r["processes"] == 1 and r.get("payouts_per_s")]
    at_200 = [r for r in one if r["rail_latency_ms"] == 200]
    at_0 = [r for r in rows if r["rail_latency_ms"] == 0 and r.get("payouts_per_s")]
    best_one_200 = max(at_200, key=lambda r: r["payouts_per_s"], default=None)
    best_one_0 = max((r for r in at_0 if r["processes"] == 1), key=_rate, default=None)
    best_any_0 = max(at_0, key=_rate, default=None)
    ratio = None
    if best_one_0 and best_any_0:
        ratio = round(best_one_0["payouts_per_s"] / best_any_0["payouts_per_s"], 2)
    return {
        "one_process_200ms": _brief(best_one_200),
        "one_process_0ms": _brief(best_one_0),
        "any_processes_0ms": _brief(best_any_0),
        "one_over_best_0ms": ratio,
    }


def _rate(row: dict) -> float:
    return row.get("payouts_per_s") or 0.0


def _brief(row: dict | None) -> dict | None:
    if row is None:
        return None
    keys = ("processes", "concurrency", "rail_latency_ms", "payouts_per_s", "busiest_role")
    return {k: row.get(k) for k in keys}


def summary(rows: list[dict], verdict: dict) -> list[dict]:
    items = [
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
    one_200 = verdict["one_process_200ms"]
    items.append(
        {
            "label": f"goal: one process at rail 200 ms (>= {GOALS_17['one_process_200ms']}/s)",
            "value": one_200["payouts_per_s"] if one_200 else None,
            "unit": "payouts/s",
            "detail": f"at concurrency {one_200['concurrency']}" if one_200 else "not run",
        }
    )
    best = verdict["any_processes_0ms"]
    items.append(
        {
            "label": "goal: one process / best of any at rail 0"
            f" (>= {GOALS_17['one_over_best_0ms']})",
            "value": verdict["one_over_best_0ms"],
            "unit": "×",
            "detail": f"best {best['payouts_per_s']}/s with {best['processes']}×"
            f"{best['concurrency']}"
            if best
            else "not run",
        }
    )
    return items
