"""The payout floor (issue 18): what one payout costs on this box when every role is only
gunicorn (the same config, stock worker) + psycopg + PostgreSQL sending the same statements.

Run by `bench.e2e` on its private durable stack after the dlock points, so PostgreSQL, its
databases and the box are the same. Four floor servers start under `settings/gunicorn.py` with
the real roles' names (so each gets its role's threads and pool), each started through
`devstack.RoleProcess` exactly as the stack starts a role (so whatever the stack puts in front of
a role — the proxy — and the gunicorn it runs are the floor's too: like for like), and clients
connect to the URL RoleProcess gives: `bench.floor_app` for the lock
server (L1/L4/L6) and `bench.floor_payout` for payments, rail proxy and rail stub. Fresh payouts
are seeded as for a dlock point; CONCURRENCY client threads (default 32, each with two accounts
of its own, so no lock contention, as the executor spreads its slots over accounts) run every
payout through the six requests a dlock executor sends for it: L4 acquire, P2 claim, the rail
submission (which makes the proxy's call to the stub), P3 post, L6 release. The executor's
amortised requests (P1 listings, session heartbeats) and the roles' background work (reaper,
sweeper) are NOT in the floor: it is a lower bound.

CPU per payout by role: `bench.e2e.CpuSampler` over the floor servers' process trees and the
postmaster, between the first and the last completed payout, as for a dlock point. A trivial
WSGI app (`bench.floor_trivial`) under the same config, driven by keep-alive clients at the same
concurrency, gives gunicorn's own cost per request; × the requests each role serves per payout
it splits a floor role's CPU into gunicorn and the rest (psycopg + the SQL functions + JSON).

The box's load drifts, so BENCH_FLOOR_ROUNDS rounds (default 3) each run a dlock point of their
own (1 × CONCURRENCY, rail 0, through `bench.e2e`), then the floor, then the trivial app; the
result is the round with the median dlock ÷ floor ratio, with every round under `rounds`.
"""

from __future__ import annotations

import http.client
import json
import os
import queue
import statistics
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import psycopg

from bench import payout_path
from bench.proc import STATES, CpuSampler, role_pids, tree_cpu_seconds
from devstack.common import free_port
from devstack.roles import RoleProcess

CONCURRENCY = int(os.environ.get("BENCH_FLOOR_CONCURRENCY", "32"))
EXPECTED_PER_S = 80.0  # planning only: payouts = POINT_S × this, at least 8 per client
# (dlock point, floor) rounds, interleaved: the box's load drifts between and within runs.
ROUNDS = int(os.environ.get("BENCH_FLOOR_ROUNDS", "3"))
TRIVIAL_S = float(os.environ.get("BENCH_FLOOR_TRIVIAL_S", "4"))
# Requests each role serves per payout in the floor (the stub's one comes from the rail proxy).
REQUESTS = {"lockserver": 2, "payments": 2, "railproxy": 1, "railstub": 1}
PAYOUTS_SQL = """
SELECT payout_id::text, account_id, idempotency_key FROM payout
 WHERE payout_id = ANY(%s::uuid[]) ORDER BY created_at
"""


class _Client:
    """One client thread's keep-alive connections and lock session."""

    def __init__(self, ports: dict[str, int], index: int) -> None:
        self.owner = f"floor-{index}"
        self.conns = {
            role: http.client.HTTPConnection("127.0.0.1", ports[role], timeout=30)
            for role in ("lockserver", "payments", "railproxy")
        }
        status, body = self.call(
            "lockserver", "POST", "/v1/sessions", {"ownerId": self.owner, "ttlMillis": 60_000}
        )
        assert status == 201, body
        self.session_id = body["sessionId"]

    def call(
        self, role: str, method: str, path: str, body: dict | None, headers: dict | None = None
    ) -> tuple[int, dict]:
        conn = self.conns[role]
        sent = {"X-Owner-Id": self.owner, **(headers or {})}
        payload = None
        if body is not None:
            payload = json.dumps(body, separators=(",", ":")).encode()
            sent["Content-Type"] = "application/json"
        conn.request(method, path, body=payload, headers=sent)
        response = conn.getresponse()
        raw = response.read()
        return response.status, (json.loads(raw) if raw else {})

    def payout(self, payout_id: str, account_id: str, key: str) -> None:
        lock = f"payout:{account_id}"
        status, grant = self.call(*payout_path.acquire(lock, self.session_id))
        assert status == 200, grant
        token = grant["fencingToken"]
        fenced = {
            "X-Fencing-Token": str(token),
            "X-Fencing-Proof": grant["fencingProof"],
            "X-Idempotency-Key": key,
        }
        status, claimed = self.call(*payout_path.claim(payout_id), fenced)
        assert status == 200, claimed
        amount, currency = self.amounts[payout_id], self.currencies[payout_id]
        status, submitted = self.call(
            *payout_path.submission(payout_id, account_id, amount, currency, claimed), fenced
        )
        assert status == 200, submitted
        status, posted = self.call(*payout_path.post(payout_id, submitted), fenced)
        assert status == 200, posted
        status, _ = self.call(
            *payout_path.release(lock, self.session_id), {"X-Fencing-Token": str(token)}
        )
        assert status == 204

    amounts: dict[str, int]
    currencies: dict[str, str]


def _start(stack, logdir: Path) -> dict[str, RoleProcess]:
    rail_port = free_port()
    env = {
        **stack.env,
        "FLOOR_DATABASE_URL": stack.env["LOCK_DATABASE_URL"],
        "FLOOR_RAIL_URL": f"http://127.0.0.1:{rail_port}",
        "DJANGO_SETTINGS_MODULE": "settings.tooling",
    }
    apps = {
        "lockserver": ("bench.floor_app", free_port()),
        "payments": ("bench.floor_payout", free_port()),
        "railproxy": ("bench.floor_payout", free_port()),
        "railstub": ("bench.floor_payout", rail_port),
    }
    procs = {
        role: RoleProcess(
            role, port, env, logdir / f"floor-{role}.log", app=app, name=f"floor-{role}"
        )
        for role, (app, port) in apps.items()
    }
    for proc in procs.values():
        proc.start(wait=False)
    try:
        for proc in procs.values():
            proc.wait_ready()
    except Exception:
        for proc in procs.values():
            proc.stop()
        raise
    return procs


def _load(stack, ids: list[str]) -> tuple[list[tuple[str, str, str]], dict, dict]:
    with psycopg.connect(stack.env["PAY_DATABASE_URL"]) as conn:
        rows = conn.execute(PAYOUTS_SQL, (ids,)).fetchall()
        details = conn.execute(
            "SELECT payout_id::text, amount_minor, currency FROM payout"
            " WHERE payout_id = ANY(%s::uuid[])",
            (ids,),
        ).fetchall()
    amounts = {p: int(a) for p, a, _ in details}
    currencies = {p: c for p, _, c in details}
    return rows, amounts, currencies


def _drive(procs: dict[str, RoleProcess], stack, ids: list[str], concurrency: int) -> dict:
    rows, amounts, currencies = _load(stack, ids)
    # Each client owns whole accounts (no two clients ever want one lock): accounts round-robin.
    by_account: dict[str, list[tuple[str, str, str]]] = defaultdict(list)
    for row in rows:
        by_account[row[1]].append(row)
    work: list[queue.SimpleQueue] = [queue.SimpleQueue() for _ in range(concurrency)]
    for i, account in enumerate(sorted(by_account)):
        for row in by_account[account]:
            work[i % concurrency].put(row)
    ports = {role: proc.port for role, proc in procs.items()}
    done: list[float] = []
    errors: list[str] = []
    ready = threading.Barrier(concurrency + 1)

    def worker(index: int) -> None:
        try:
            client = _Client(ports, index)
        except Exception as exc:
            errors.append(f"session: {type(exc).__name__}: {str(exc)[:120]}")
            ready.wait()
            return
        client.amounts, client.currencies = amounts, currencies
        ready.wait()
        while True:
            try:
                payout_id, account_id, key = work[index].get_nowait()
            except queue.Empty:
                return
            try:
                client.payout(payout_id, account_id, key)
            except Exception as exc:  # counted, never hidden
                errors.append(f"{type(exc).__name__}: {str(exc)[:120]}")
                continue
            done.append(time.time())

    pids = {role: proc.process.pid for role, proc in procs.items()}
    pids["postgres"] = role_pids(stack)["postgres"]
    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(concurrency)]
    for thread in threads:
        thread.start()
    load_1m = round(os.getloadavg()[0], 2)
    with CpuSampler(pids) as sampler:
        ready.wait()
        for thread in threads:
            thread.join(300)
    done.sort()
    count = len(done)
    if count < 2:
        raise RuntimeError(f"payout floor: {count} payouts completed; errors {errors[:3]}")
    span = done[-1] - done[0]
    begin, end = sampler.at(done[0]), sampler.at(done[-1])
    used = {role: end[role] - begin[role] for role in pids}
    cpu = {role: round(used[role] * 1000 / (count - 1), 2) for role in pids}
    cpu["total"] = round(sum(cpu.values()), 2)
    with psycopg.connect(stack.env["PAY_DATABASE_URL"]) as conn:
        states = dict(conn.execute(STATES, (ids,)).fetchall())
    return {
        "concurrency": concurrency,
        "loadavg_1m_at_start": load_1m,
        "payouts": len(rows),
        "completed": count,
        "states": states,
        "errors": len(errors),
        "errors_sample": errors[:5],
        "window_s": round(span, 3),
        "payouts_per_s": round((count - 1) / span, 2) if span else None,
        "cpu_ms_per_payout": cpu,
        "cores_busy": {role: round(used[role] / span, 2) for role in pids} if span else {},
    }


def trivial_request_cost(logdir: Path, concurrency: int, seconds: float = TRIVIAL_S) -> dict:
    """gunicorn's own CPU per request: a WSGI app that answers a fixed JSON body, under the same
    config (the lock server's threads), keep-alive clients at `concurrency`."""
    proc = RoleProcess(
        "lockserver",
        free_port(),
        {},
        logdir / "floor-trivial.log",
        app="bench.floor_trivial",
        name="floor-trivial",
    ).start()
    try:
        stop = time.monotonic() + 0.5 + seconds
        counts = [0] * concurrency
        ready = threading.Barrier(concurrency + 1)
        body = json.dumps({"sessionId": str(uuid.uuid4())}).encode()

        def worker(index: int) -> None:
            conn = http.client.HTTPConnection("127.0.0.1", proc.port, timeout=30)
            ready.wait()
            while time.monotonic() < stop:
                conn.request(
                    "POST",
                    "/v1/locks/x/acquire",
                    body=body,
                    headers={"Content-Type": "application/json"},
                )
                conn.getresponse().read()
                counts[index] += 1

        threads = [
            threading.Thread(target=worker, args=(i,), daemon=True) for i in range(concurrency)
        ]
        for thread in threads:
            thread.start()
        ready.wait()
        time.sleep(0.5)  # warm-up
        before, n0, t0 = tree_cpu_seconds(proc.process.pid), sum(counts), time.monotonic()
        for thread in threads:
            thread.join(seconds + 60)
        cpu, n, t = (
            tree_cpu_seconds(proc.process.pid) - before,
            sum(counts) - n0,
            time.monotonic() - t0,
        )
    finally:
        proc.stop()
    return {
        "requests": n,
        "requests_per_s": round(n / t, 1) if t else None,
        "cpu_ms_per_request": round(cpu * 1000 / n, 3) if n else None,
    }


def run(
    stack, *, logdir: Path, payouts_s: float, dlock_point: Callable[[], dict], rounds: int = ROUNDS
) -> dict:
    """`rounds` rounds of (a dlock point at 1 × CONCURRENCY, rail 0 — `dlock_point()` —, then
    the floor on freshly seeded payouts, then the trivial app), so every ratio compares runs
    seconds apart. The top-level numbers are the round whose dlock ÷ floor ratio is the median;
    `rounds` has every round."""
    done = []
    for index in range(rounds):
        dlock_row = dlock_point()
        floor = _floor_once(stack, logdir=logdir, payouts_s=payouts_s)
        trivial = trivial_request_cost(logdir, CONCURRENCY)
        parts = layers(floor, trivial, dlock_row)
        done.append(
            {
                "round": index + 1,
                **floor,
                "trivial_app": trivial,
                "dlock": {
                    k: dlock_row.get(k)
                    for k in (
                        "processes",
                        "concurrency",
                        "payouts_per_s",
                        "cpu_ms_per_payout",
                        "loadavg_1m_at_start",
                    )
                },
                "layers": parts,
            }
        )
        print(
            f"[bench] e2e payout floor round {index + 1}: dlock {parts.get('dlock_total_ms')} ms,"
            f" floor {floor['cpu_ms_per_payout']['total']} ms ({floor['payouts_per_s']}/s),"
            f" ratio {parts.get('dlock_over_floor')}×",
            flush=True,
        )
    ratios = [r["layers"].get("dlock_over_floor") for r in done]
    known = [r for r in ratios if r is not None]
    median = round(statistics.median(known), 2) if known else None
    middle = min(
        done, key=lambda r: abs((r["layers"].get("dlock_over_floor") or 0) - (median or 0))
    )
    return {
        "what": "every role as gunicorn (same config and worker, started through RoleProcess like"
        " dlock's roles) + psycopg + the same "
        "SQL functions, no Django/DRF/middleware/logs/metrics; 6 requests per payout (L4, P2, "
        "rail submission → stub, P3, L6); without P1 listings, heartbeats, background work",
        "interleaved": f"{rounds} rounds of (dlock 1×{CONCURRENCY} rail 0, floor, trivial app);"
        " the top level is the round with the median dlock ÷ floor ratio",
        **{k: v for k, v in middle.items() if k != "round"},
        "median_round": middle["round"],
        "dlock_over_floor_median": median,
        "dlock_over_floor_rounds": ratios,
        "rounds": done,
    }


def _floor_once(stack, *, logdir: Path, payouts_s: float) -> dict:
    """Seed fresh payouts and drive them through the floor servers at CONCURRENCY."""
    from experiment.arms.fenced import seed_fenced
    from experiment.config import ExperimentConfig

    result = stack.manage("railstub_config", "--reset", "--latency-ms", "0")
    if result.returncode != 0:
        raise RuntimeError(f"railstub_config failed: {result.stderr[-500:]}")
    payouts = max(8 * CONCURRENCY, int(payouts_s * EXPECTED_PER_S))
    config = ExperimentConfig(executors=1, accounts=2 * CONCURRENCY, payouts=payouts)
    ids = seed_fenced(stack, config)["payouts"]
    procs = _start(stack, logdir)
    try:
        return _drive(procs, stack, ids, CONCURRENCY)
    finally:
        for proc in procs.values():
            proc.stop()


def layers(floor: dict, trivial: dict, dlock_row: dict | None) -> dict:
    """Per payout: PostgreSQL, gunicorn (trivial cost × requests), psycopg + SQL functions + JSON
    (the rest of the floor roles), and what dlock adds over the floor (Django, DRF, our code,
    and the requests the floor leaves out)."""
    cpu = floor["cpu_ms_per_payout"]
    per_request = trivial.get("cpu_ms_per_request") or 0.0
    gunicorn = round(per_request * sum(REQUESTS.values()), 2)
    app_roles = round(sum(cpu[role] for role in REQUESTS), 2)
    out: dict = {
        "postgres_ms": cpu["postgres"],
        "gunicorn_ms": gunicorn,
        "psycopg_sql_json_ms": round(app_roles - gunicorn, 2),
        "floor_total_ms": cpu["total"],
    }
    if dlock_row and dlock_row.get("cpu_ms_per_payout"):
        mine = dlock_row["cpu_ms_per_payout"]
        out["dlock_point"] = f"{dlock_row['processes']}×{dlock_row['concurrency']}"
        out["dlock_total_ms"] = mine["total"]
        out["dlock_over_floor"] = round(mine["total"] / cpu["total"], 2) if cpu["total"] else None
        out["above_floor_by_role_ms"] = {
            role: round(mine[role] - cpu[role], 2) for role in (*REQUESTS, "postgres")
        }
        out["django_drf_ours_ms"] = round(sum(mine[role] for role in REQUESTS) - app_roles, 2)
    return out
