"""Lock server on PostgreSQL: acquire+release pairs/s and p50/p99 over HTTP to gunicorn, and the
same SQL statements issued directly with psycopg, in the same run, at 1/8/32 clients.

Starts its own durable PostgreSQL cluster (fsync on) and one lock-server (ROLE=lockserver,
LOCK_BACKEND=pg, gunicorn defaults) on free ports. Each client holds one session and loops
acquire → release on a key of its own (no contention: this measures the path, not queueing).
"direct" sends `ACQUIRE_SQL` and `RELEASE_SQL` of `lockserver.backends.pg_sql` (the statements the
backend sends on the granted path) on one autocommit psycopg connection per client.
"floor_no_django" sends the HTTP clients to bench/floor_app.py (the same SQL behind the same
gunicorn config, without Django/DRF): the floor of the HTTP path on this machine. At each level
the HTTP and floor arms alternate (dlock, floor, dlock, floor, …: BENCH_LOCKSERVER_ROUNDS rounds,
default 3, of BENCH_LOCKSERVER_ROUND_S seconds, default 3); `http_over_floor` is the median of
the rounds' ratios, `rounds` has every round (the box's load drifts within a run).
Writes `<out_dir>/lockserver.json` (etcd rows from `bench.lock_etcd` merged in when present).

    python -m bench.lockserver [out_dir]      # default .run/bench
"""

from __future__ import annotations

import http.client
import json
import os
import secrets
import shutil
import statistics
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from pathlib import Path

from bench import credentials
from bench.proc import cpu_seconds
from devstack.common import PROJECT, free_port
from devstack.postgres import PgCluster
from devstack.roles import RoleProcess, manage
from lockserver.backends.pg_sql import acquire as acquire_sql
from lockserver.backends.pg_sql import release as release_sql
from lockserver.backends.pg_sql import sessions as sessions_sql

DURATION_S = float(os.environ.get("BENCH_LOCKSERVER_SECONDS", "5"))
# dlock's HTTP arm and the floor arm alternate, ROUNDS times ROUND_S each (dlock, floor, dlock,
# floor, …): the box's load drifts between runs and within one (the ratio moved 0.34–0.85×
# between single back-to-back runs); the goal's ratio is the median of the per-round ratios.
ROUNDS = int(os.environ.get("BENCH_LOCKSERVER_ROUNDS", "3"))
ROUND_S = float(os.environ.get("BENCH_LOCKSERVER_ROUND_S", "3"))
WARMUP_S = 0.5
CLIENTS = (1, 8, 32)


def _percentile(samples: list[float], q: float) -> float:
    if not samples:
        return 0.0
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def _drive(
    clients: int,
    make_pair: Callable[[int], Callable[[], None]],
    seconds: float,
    server_pid: int | None = None,
) -> dict:
    """`clients` threads each loop their pair function; latency is per acquire+release pair.

    With `server_pid`, also the CPU the server process spent per pair and its cores busy, and
    the CPU of this (client) process: where a 2-core box's time went.
    """
    latencies: list[list[float]] = [[] for _ in range(clients)]
    errors = [0] * clients
    kinds: dict[str, int] = {}
    ready = threading.Barrier(clients + 1)
    window = {"start": 0.0, "stop": 0.0}

    def worker(index: int) -> None:
        try:
            pair = make_pair(index)
        except Exception as exc:  # no session: this client counts one error and sits out
            errors[index] += 1
            kind = f"setup: {str(exc)[:60]}"
            kinds[kind] = kinds.get(kind, 0) + 1
            ready.wait()
            return
        ready.wait()
        while time.monotonic() < window["start"]:
            try:
                pair()  # warm-up
            except Exception:  # counted in the measured window only
                time.sleep(0.01)
        while True:
            began = time.monotonic()
            if began >= window["stop"]:
                return
            try:
                pair()
            except Exception as exc:
                errors[index] += 1
                kind = str(exc).split(":")[0][:60] or type(exc).__name__
                kinds[kind] = kinds.get(kind, 0) + 1
                continue
            latencies[index].append(time.monotonic() - began)

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(clients)]
    for thread in threads:
        thread.start()
    window["start"] = time.monotonic() + WARMUP_S
    window["stop"] = window["start"] + seconds
    ready.wait()
    time.sleep(max(0.0, window["start"] - time.monotonic()))
    cpu_before = (cpu_seconds(server_pid) if server_pid else 0.0, time.process_time())
    for thread in threads:
        thread.join(seconds + 60)
    cpu = (
        cpu_seconds(server_pid) - cpu_before[0] if server_pid else 0.0,
        time.process_time() - cpu_before[1],
    )
    samples = [s for per_client in latencies for s in per_client]
    accounting = {"client_cores_busy": round(cpu[1] / seconds, 2)}
    if server_pid and samples:
        accounting["server_cores_busy"] = round(cpu[0] / seconds, 2)
        accounting["server_cpu_ms_per_pair"] = round(cpu[0] * 1000 / len(samples), 2)
    return {
        **accounting,
        "pairs": len(samples),
        "pairs_per_s": round(len(samples) / seconds, 1),
        "p50_ms": round(_percentile(samples, 0.50) * 1000, 2),
        "p99_ms": round(_percentile(samples, 0.99) * 1000, 2),
        "errors": sum(errors),
        "errors_by_kind": kinds,
    }


def _http_pair_factory(port: int) -> Callable[[int], Callable[[], None]]:
    def make(index: int) -> Callable[[], None]:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        owner = f"bench-{index}"

        def call(method: str, path: str, body: dict | None, headers: dict) -> tuple[int, bytes]:
            payload = json.dumps(body).encode() if body is not None else None
            if payload is not None:
                headers = {**headers, "Content-Type": "application/json"}
            conn.request(method, path, body=payload, headers=headers)
            response = conn.getresponse()
            return response.status, response.read()

        headers = {"X-Owner-Id": owner, **credentials.headers()}
        for _ in range(20):  # 32 clients opening at once may be shed (503 OVERLOADED): retry
            status, raw = call(
                "POST", "/v1/sessions", {"ownerId": owner, "ttlMillis": 60_000}, headers
            )
            if status != 503:
                break
            time.sleep(0.25)
        assert status == 201, raw
        session_id = json.loads(raw)["sessionId"]
        key = f"bench:http:{index}:{uuid.uuid4().hex[:8]}"

        def pair() -> None:
            status, raw = call(
                "POST", f"/v1/locks/{key}/acquire", {"sessionId": session_id}, headers
            )
            if status != 200:
                code = json.loads(raw).get("code") if raw.startswith(b"{") else ""
                raise RuntimeError(f"acquire {status} {code}")
            grant = json.loads(raw)
            status, raw = call(
                "DELETE",
                f"/v1/locks/{key}?sessionId={session_id}",
                None,
                {**headers, **credentials.headers(grant)},
            )
            if status != 204:
                code = json.loads(raw).get("code") if raw.startswith(b"{") else ""
                raise RuntimeError(f"release {status} {code}")

        return pair

    return make


def _direct_pair_factory(db_url: str) -> Callable[[int], Callable[[], None]]:
    import psycopg

    def make(index: int) -> Callable[[], None]:
        conn = psycopg.connect(db_url, autocommit=True)
        owner = f"bench-direct-{index}"
        session_id = uuid.uuid4()
        with conn.cursor() as cur:
            sessions_sql.open_session(cur, session_id=session_id, owner_id=owner, ttl_ms=60_000)
        key = f"bench:direct:{index}:{uuid.uuid4().hex[:8]}"

        def pair() -> None:
            with conn.cursor() as cur:
                acquired = acquire_sql.try_acquire(
                    cur, key=key, session_id=session_id, owner_id=owner, ttl_ms=10_000
                )
                if acquired is None:
                    raise RuntimeError("direct acquire refused")
                if release_sql.release(cur, key=key, token=acquired.grant.fencing_token) is None:
                    raise RuntimeError("direct release refused")

        return pair

    return make


def _ratio(row: dict, direct: dict) -> float | None:
    return round(row["pairs_per_s"] / direct["pairs_per_s"], 3) if direct["pairs_per_s"] else None


def _kept(make_pair: Callable[[int], Callable[[], None]]) -> Callable[[int], Callable[[], None]]:
    """The same pair function (connection, session, key) for a client index every time."""
    made: dict[int, Callable[[], None]] = {}
    guard = threading.Lock()

    def make(index: int) -> Callable[[], None]:
        with guard:
            known = made.get(index)
        if known is None:
            known = make_pair(index)
            with guard:
                made[index] = known
        return known

    return make


def _interleaved(clients: int, server: RoleProcess, floor: RoleProcess) -> dict:
    """ROUNDS rounds of (dlock over HTTP, then the floor arm), ROUND_S each, at `clients`.

    `http` and `floor_no_django` are the round whose ratio is the median (its numbers are the
    ones the median ratio was computed from); `rounds` has every round."""
    rounds = []
    # Each client opens its session once per arm (in round 1) and keeps it for every round.
    dlock_pairs = _kept(_http_pair_factory(server.port))
    floor_pairs = _kept(_http_pair_factory(floor.port))
    for index in range(ROUNDS):
        http_row = _drive(clients, dlock_pairs, ROUND_S, server.process.pid)
        floor_row = _drive(clients, floor_pairs, ROUND_S, floor.process.pid)
        rounds.append(
            {
                "round": index + 1,
                "loadavg_1m": round(os.getloadavg()[0], 2),
                "http": http_row,
                "floor_no_django": floor_row,
                "http_over_floor": _ratio(http_row, floor_row),
            }
        )
    ratios = [r["http_over_floor"] for r in rounds if r["http_over_floor"] is not None]
    median = round(statistics.median(ratios), 3) if ratios else None
    middle = min(rounds, key=lambda r: abs((r["http_over_floor"] or 0) - (median or 0)))
    return {
        "http": middle["http"],
        "floor_no_django": middle["floor_no_django"],
        "http_over_floor": median,
        "http_over_floor_rounds": [r["http_over_floor"] for r in rounds],
        "rounds": rounds,
    }


def _level(n: int, server: RoleProcess, floor: RoleProcess, db_url: str) -> dict:
    """One client count: dlock over HTTP and the floor app interleaved, then the SQL sent direct."""
    arms = _interleaved(n, server, floor)
    direct_row = _drive(n, _direct_pair_factory(db_url), DURATION_S)
    http_row, floor_row = arms["http"], arms["floor_no_django"]
    return {
        "clients": n,
        "http": http_row,
        "floor_no_django": floor_row,
        "direct": direct_row,
        "http_over_direct": _ratio(http_row, direct_row),
        "floor_over_direct": _ratio(floor_row, direct_row),
        # issue 18's goal: >= 0.8 at 8 clients (the framework's share of the path),
        # the median of the interleaved rounds' ratios
        "http_over_floor": arms["http_over_floor"],
        "http_over_floor_rounds": arms["http_over_floor_rounds"],
        "rounds": arms["rounds"],
    }


def run(out_dir: str | Path = ".run/bench", clients: tuple[int, ...] = CLIENTS) -> dict:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="dlock-bench-lockserver-"))
    work.chmod(0o755)
    cluster = PgCluster(work / "pg", free_port())  # durable: fsync on, synchronous_commit on
    server: RoleProcess | None = None
    floor: RoleProcess | None = None
    try:
        cluster.start()
        db_url = cluster.create_database("bench_lockdb")
        env = {
            "DJANGO_SECRET_KEY": os.environ.get("DJANGO_SECRET_KEY") or secrets.token_urlsafe(48),
            "DJANGO_DEBUG": "false",
            "LOCK_BACKEND": "pg",
            "LOCK_DATABASE_URL": db_url,
            "DLOCK_LOG_LEVEL": "WARNING",  # per-request INFO events off, as in bench.lock_etcd
            "LOCK_RETRY_BUDGET": "1000000",
            **credentials.server_env(),  # issue 15 credentials, decision 15 proof keys
        }
        manage(["migrate", "--no-input", "-v", "0"], env, role="lockserver")
        server = RoleProcess("lockserver", free_port(), env, work / "lockserver.log").start()
        floor = RoleProcess(
            "lockserver",  # the lock server's gunicorn defaults (threads, pool size)
            free_port(),
            {"FLOOR_DATABASE_URL": db_url, **credentials.server_env()},
            work / "floor.log",
            app="bench.floor_app",
        ).start()
        levels = []
        load_before = os.getloadavg()
        for n in clients:
            levels.append(_level(n, server, floor, db_url))
        version = cluster.psql("SHOW server_version")
        result: dict = {
            "name": "lockserver",
            "backend": "pg",
            "postgres": version,
            "durability": "fsync=on, synchronous_commit=on (PgCluster defaults)",
            "server": "gunicorn, 1 worker x 32 threads (settings/gunicorn.py), DB_POOL_MAX="
            + os.environ.get("DB_POOL_MAX", "8"),
            "seconds_per_level": DURATION_S,
            "interleaved": f"dlock HTTP and floor alternate, {ROUNDS} rounds × {ROUND_S} s each;"
            " http_over_floor is the median of the rounds' ratios",
            "workload": "per client: one session, loop acquire+release on its own key",
            "direct": "pg_sql ACQUIRE_SQL + RELEASE_SQL via psycopg, one connection/client",
            "floor_no_django": "bench/floor_app.py: the same SQL over a psycopg pool behind the "
            "same gunicorn config, without Django/DRF/middleware/validation/logs/metrics (not a "
            "lock server; the floor of this machine's HTTP path)",
            "goal": "http_over_direct >= 0.5 at 8 clients",
            "cpus": os.cpu_count(),
            "loadavg_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
            "levels": levels,
        }
        eight = next((lvl for lvl in levels if lvl["clients"] == 8), None)
        if eight is not None:
            result["goal_met"] = bool(
                eight["http_over_direct"] and eight["http_over_direct"] >= 0.5
            )
            result["http_over_floor_8"] = eight["http_over_floor"]
            result["http_over_floor_8_rounds"] = eight["http_over_floor_rounds"]
    finally:
        if server is not None:
            server.stop()
        if floor is not None:
            floor.stop()
        cluster.stop("immediate")
        shutil.rmtree(work, ignore_errors=True)
    result["etcd"] = _etcd_rows(out, clients)
    (out / "lockserver.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def _etcd_rows(out: Path, clients: tuple[int, ...]) -> dict | None:
    """The etcd backend's numbers from bench.lock_etcd (issue 4), when it is built."""
    if not (PROJECT / "bench" / "lock_etcd.py").exists():
        return None
    try:
        from bench import lock_etcd

        return lock_etcd.run(out, clients)
    except Exception as exc:  # its failure must not hide the pg numbers
        return {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-2000:]}


if __name__ == "__main__":
    print(json.dumps(run(sys.argv[1] if len(sys.argv) > 1 else ".run/bench"), indent=2))
