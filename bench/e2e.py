"""End-to-end payouts/s: the real executors, lock server, payments and rail proxy, rail at zero
latency, on a private durable PostgreSQL cluster (fsync on), with 1, 2 and 4 executors.

Each point seeds fresh accounts (twice as many as executors, so one-lock-per-account does not
serialise them) and payouts, runs the executors with `--until-idle`, and measures from the
database clock: (posted − 1) / (last POSTED event − first POSTED event), so process start-up
is not counted.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

from experiment.runner import ExperimentConfig, seed_fenced
from experiment.stack import private_stack
from experiment.workers import spawn_executor

EXECUTORS = (1, 2, 4)
POSTED_WINDOW = """
SELECT count(*), min(at), max(at) FROM payout_event
 WHERE to_state = 'POSTED' AND payout_id = ANY(%s::uuid[])
"""
STATES = "SELECT state, count(*) FROM payout WHERE payout_id = ANY(%s::uuid[]) GROUP BY state"


def _point(stack, k: int, per_executor: int, logdir: Path) -> dict:
    config = ExperimentConfig(executors=k, accounts=2 * k, payouts=per_executor * k)
    seeded = seed_fenced(stack, config)
    ids = seeded["payouts"]
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
    with psycopg.connect(pay) as conn:
        count, first, last = conn.execute(POSTED_WINDOW, (ids,)).fetchone()
    span = (last - first).total_seconds() if count and count > 1 else 0.0
    return {
        "executors": k,
        "accounts": 2 * k,
        "payouts": len(ids),
        "posted": count,
        "states": states,
        "window_s": round(span, 3),
        "payouts_per_s": round((count - 1) / span, 2) if span else None,
    }


def run(out_dir: Path, *, per_executor: int = 40, executors: tuple[int, ...] = EXECUTORS) -> dict:
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
            rows.append(_point(stack, k, per_executor, logdir))
    finally:
        stop()
        shutil.rmtree(base, ignore_errors=True)
    data = {
        "name": "e2e",
        "what": "payouts/s end to end (lock → claim → rail proxy → stub → post → release)",
        "rail_latency_ms": 0,
        "durable_cluster": True,
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
    return {**data, "summary": summary}
