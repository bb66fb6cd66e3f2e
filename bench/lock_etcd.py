"""Lock server on etcd: acquire+release pairs/s and p50/p99 over HTTP, and the same etcd
transactions issued directly (in-process `EtcdLockBackend`, no HTTP, no Django), same run.

Starts its own etcd (WAL fsync on, as etcd always does), its own PostgreSQL cluster for lockdb
(the lock-server role's readiness probe and pg-sequence floor read it) unless
`lock_database_url` is given, and one lock-server under gunicorn. Each client holds one
session and loops acquire → release on a key of its own (no contention: this measures the
path, not queueing). Writes `<out_dir>/lock_etcd.json`; returns the same dict.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import requests

from bench import credentials
from bench.proc import tree_cpu_seconds
from devstack.common import free_port
from devstack.etcd import EtcdServer
from devstack.postgres import PgCluster
from devstack.roles import RoleProcess, manage

DURATION_S = float(os.environ.get("BENCH_LOCK_ETCD_SECONDS", "5"))
WARMUP_S = 0.5


def _percentile(samples: list[float], q: float) -> float:
    if not samples:
        return 0.0
    ordered = sorted(samples)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def _drive(
    clients: int,
    make_pair: Callable[[int], Callable[[], None]],
    seconds: float,
    etcd_pid: int | None = None,
) -> dict[str, float]:
    """Run `clients` threads, each calling its pair function in a loop; latency per pair, and
    the etcd process's CPU per pair over the measured window (`etcd_pid`)."""
    latencies: list[list[float]] = [[] for _ in range(clients)]
    errors = [0] * clients
    start = threading.Barrier(clients + 1)
    stop_at = [0.0]

    def worker(index: int) -> None:
        try:
            pair = make_pair(index)
        except Exception:  # no session: this client counts one error and sits out
            errors[index] += 1
            start.wait()
            return
        start.wait()
        warm_until = time.monotonic() + WARMUP_S
        while time.monotonic() < warm_until:
            pair()
        while True:
            began = time.monotonic()
            if stop_at[0] and began >= stop_at[0]:
                return
            try:
                pair()
            except Exception:
                errors[index] += 1
                continue
            latencies[index].append(time.monotonic() - began)

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(clients)]
    for thread in threads:
        thread.start()
    start.wait()
    time.sleep(WARMUP_S)
    measured_from = time.monotonic()
    etcd_cpu_from = tree_cpu_seconds(etcd_pid) if etcd_pid else None
    stop_at[0] = measured_from + seconds
    for thread in threads:
        thread.join(seconds + 30)
    elapsed = time.monotonic() - measured_from
    etcd_cpu = (
        tree_cpu_seconds(etcd_pid) - etcd_cpu_from
        if etcd_pid and etcd_cpu_from is not None
        else None
    )
    flat = [x for per in latencies for x in per]
    return {
        "etcd_cpu_ms_per_pair": round(etcd_cpu * 1000 / len(flat), 3)
        if etcd_cpu is not None and flat
        else None,
        "pairs": len(flat),
        "errors": sum(errors),
        "pairs_per_s": round(len(flat) / elapsed, 1),
        "p50_ms": round(_percentile(flat, 0.50) * 1000, 2),
        "p99_ms": round(_percentile(flat, 0.99) * 1000, 2),
        "mean_ms": round(statistics.fmean(flat) * 1000, 2) if flat else 0.0,
    }


def _http_pair_factory(base_url: str) -> Callable[[int], Callable[[], None]]:
    def make(index: int) -> Callable[[], None]:
        http = requests.Session()
        owner = f"bench-{index}"
        for _ in range(20):  # 32 clients opening at once may be shed (503 OVERLOADED): retry
            resp = http.post(
                f"{base_url}/v1/sessions",
                json={"ownerId": owner, "ttlMillis": 60_000},
                headers={"X-Owner-Id": owner, **credentials.headers()},
                timeout=5,
            )
            if resp.status_code != 503:
                break
            time.sleep(0.25)
        resp.raise_for_status()
        session_id = resp.json()["sessionId"]
        key = f"bench:etcd-http-{index}-{uuid.uuid4().hex[:6]}"
        headers = {"X-Owner-Id": owner, **credentials.headers()}

        def pair() -> None:
            acquired = http.post(
                f"{base_url}/v1/locks/{key}/acquire",
                json={"sessionId": session_id, "ttlMillis": 10_000},
                headers=headers,
                timeout=5,
            )
            if acquired.status_code != 200:
                raise RuntimeError(f"acquire answered {acquired.status_code}")
            released = http.delete(
                f"{base_url}/v1/locks/{key}",
                params={"sessionId": session_id},
                headers={**headers, **credentials.headers(acquired.json())},
                timeout=5,
            )
            if released.status_code != 204:
                raise RuntimeError(f"release answered {released.status_code}")

        return pair

    return make


def _direct_pair_factory(backend) -> Callable[[int], Callable[[], None]]:
    def make(index: int) -> Callable[[], None]:
        session = backend.open_session(owner_id=f"bench-{index}", ttl_ms=60_000)
        key = f"bench:etcd-direct-{index}-{uuid.uuid4().hex[:6]}"

        def pair() -> None:
            grant = backend.acquire(
                key=key, session_id=session.session_id, owner_id=None, ttl_ms=10_000, wait_ms=0
            )
            backend.release(key=key, session_id=session.session_id, token=grant.fencing_token)

        return pair

    return make


def etcd_version(url: str) -> str:
    try:
        return requests.get(f"{url}/version", timeout=2).json().get("etcdserver", "?")
    except requests.RequestException:
        return "?"


def run(
    out_dir: str | Path,
    clients: tuple[int, ...] = (1, 8, 32),
    *,
    lock_database_url: str | None = None,
    seconds: float = DURATION_S,
) -> dict:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="dlock-bench-etcd-"))
    work.chmod(0o755)
    etcd = EtcdServer(work / "etcd", free_port(), free_port())
    cluster: PgCluster | None = None
    server: RoleProcess | None = None
    try:
        etcd.start()
        if lock_database_url is None:
            cluster = PgCluster(work / "pg", free_port())  # durable: fsync on
            cluster.start()
            lock_database_url = cluster.create_database("bench_lockdb")
        env = {
            "DJANGO_SECRET_KEY": os.environ.get("DJANGO_SECRET_KEY") or secrets.token_urlsafe(48),
            "DJANGO_DEBUG": "false",
            "LOCK_BACKEND": "etcd",
            "ETCD_URL": etcd.url,
            "LOCK_DATABASE_URL": lock_database_url,
            "DLOCK_LOG_LEVEL": "WARNING",
            **credentials.server_env(),  # issue 15 credentials, decision 15 proof keys
        }
        manage(["migrate", "--no-input", "-v", "0"], env, role="lockserver")
        server = RoleProcess("lockserver", free_port(), env, work / "lockserver.log").start()

        # the backend reads django.conf.settings (defaults in settings/base.py); no setup()
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "settings.ops")
        os.environ.setdefault("DJANGO_SECRET_KEY", env["DJANGO_SECRET_KEY"])
        for name in ("LOCK_DATABASE_URL", "PAY_DATABASE_URL", "RAIL_DATABASE_URL"):
            os.environ.setdefault(name, lock_database_url)  # settings.ops wants all three URLs
        from lockserver.backends.etcd.backend import EtcdLockBackend

        direct = EtcdLockBackend(
            url=etcd.url, prefix="direct/", adopt_pg_sequence=False, housekeeping=False
        )
        levels = []
        for n in clients:
            assert etcd.process is not None
            http_row = _drive(n, _http_pair_factory(server.url), seconds, etcd.process.pid)
            direct_row = _drive(n, _direct_pair_factory(direct), seconds, etcd.process.pid)
            levels.append(
                {
                    "clients": n,
                    "http": http_row,
                    "direct": direct_row,
                    "http_over_direct": round(
                        http_row["pairs_per_s"] / direct_row["pairs_per_s"], 3
                    )
                    if direct_row["pairs_per_s"]
                    else None,
                }
            )
        direct.close()
        result = {
            "name": "lock_etcd",
            "backend": "etcd",
            "etcd_version": etcd_version(etcd.url),
            "seconds_per_level": seconds,
            "workload": "per client: one session, loop acquire+release on its own key",
            "direct": "the same etcd transactions from an in-process EtcdLockBackend, no HTTP",
            "levels": levels,
        }
        (out / "lock_etcd.json").write_text(json.dumps(result, indent=2) + "\n")
        return result
    finally:
        if server is not None:
            server.stop()
        etcd.stop()
        if cluster is not None:
            cluster.stop("immediate")
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    import sys

    print(json.dumps(run(sys.argv[1] if len(sys.argv) > 1 else ".run/bench"), indent=2))
