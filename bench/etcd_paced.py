"""etcd's CPU per pair at the same rate: dlock's etcd backend (an in-process `EtcdLockBackend`,
no HTTP) beside the bare lock recipe over gRPC (a create-if-absent transaction on the client's
lease, a compare-and-delete), each unpaced and paced to one rate, rounds interleaved.

etcd's CPU per write transaction falls as the rate rises (it batches proposals, WAL appends and
fsyncs), so CPU per pair of two arms that run at different rates compares their rates as much as
their work. This measures the work: both arms paced to `BENCH_ETCD_PACED_RATE` pairs/s (default
400, about dlock-etcd's rate through HTTP on a 2-core box), `BENCH_ETCD_PACED_CLIENTS` threads
(8), `BENCH_ETCD_PACED_ROUNDS` rounds (3) of `BENCH_ETCD_PACED_ROUND_S` seconds (3). Prints and
returns per arm and pace: pairs/s, etcd CPU ms/pair, put+delete ops/pair (etcd's counters), and
the medians of per-round ratios dlock ÷ recipe; writes `<out>/etcd_paced.json`.

    .venv/bin/python -m bench.etcd_paced [out_dir]     # or: python -m bench --only etcd_paced
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

from bench.proc import tree_cpu_seconds
from devstack.common import free_port
from devstack.etcd import EtcdServer

RATE = float(os.environ.get("BENCH_ETCD_PACED_RATE", "400"))
CLIENTS = int(os.environ.get("BENCH_ETCD_PACED_CLIENTS", "8"))
ROUNDS = int(os.environ.get("BENCH_ETCD_PACED_ROUNDS", "3"))
ROUND_S = float(os.environ.get("BENCH_ETCD_PACED_ROUND_S", "3"))


def _ops(url: str) -> float:
    """etcd's put + delete operations so far."""
    text = requests.get(f"{url}/metrics", timeout=5).text
    return sum(
        float(found.group(1))
        for name in ("etcd_mvcc_put_total", "etcd_mvcc_delete_total")
        if (found := re.search(rf"^{name} (\S+)$", text, re.M))
    )


def _drive(make_pair: Callable[[int], Callable[[], None]], rate: float, etcd: EtcdServer) -> dict:
    """CLIENTS threads for ROUND_S seconds, each pacing itself to rate / CLIENTS pairs/s
    (rate 0: as fast as it can)."""
    assert etcd.process is not None
    pairs = [make_pair(index) for index in range(CLIENTS)]
    for pair in pairs:
        pair()  # warm: sessions, leases, the key's first grant
    done = [0] * CLIENTS
    gap = CLIENTS / rate if rate else 0.0
    begin = time.monotonic()
    stop = begin + ROUND_S

    def worker(index: int) -> None:
        due = begin + gap * index / CLIENTS
        while (now := time.monotonic()) < stop:
            if gap and now < due:
                time.sleep(due - now)
                continue
            pairs[index]()
            done[index] += 1
            due += gap

    cpu, ops = tree_cpu_seconds(etcd.process.pid), _ops(etcd.url)
    with ThreadPoolExecutor(CLIENTS) as pool:
        list(pool.map(worker, range(CLIENTS)))
    elapsed = time.monotonic() - begin
    cpu, ops = tree_cpu_seconds(etcd.process.pid) - cpu, _ops(etcd.url) - ops
    total = max(1, sum(done))
    return {
        "pairs_per_s": round(total / elapsed, 1),
        "etcd_cpu_ms_per_pair": round(cpu * 1000 / total, 3),
        "etcd_put_delete_ops_per_pair": round(ops / total, 2),
    }


def _dlock(backend) -> Callable[[int], Callable[[], None]]:
    def make(index: int) -> Callable[[], None]:
        session = backend.open_session(owner_id=f"paced-{index}", ttl_ms=60_000).session_id
        key = f"paced-{index}-{uuid.uuid4().hex[:6]}"

        def pair() -> None:
            grant = backend.acquire(
                key=key, session_id=session, owner_id=None, ttl_ms=10_000, wait_ms=0
            )
            backend.release(key=key, session_id=session, token=grant.fencing_token)

        return pair

    return make


def _recipe(client) -> Callable[[int], Callable[[], None]]:
    from lockserver.etcd_ops import compare, delete, get, put

    def make(index: int) -> Callable[[], None]:
        lease = client.lease_grant(60)[0]
        key = f"recipe/paced-{index}-{uuid.uuid4().hex[:6]}"

        def pair() -> None:
            made = client.txn(
                [compare(key, "CREATE", "EQUAL", 0)], [put(key, "", lease)], [get(key)]
            )
            client.txn([compare(key, "CREATE", "EQUAL", made.revision)], [delete(key)])

        return pair

    return make


def run(out_dir: Path | str = ".run/bench") -> dict:
    work = Path(tempfile.mkdtemp(prefix="dlock-bench-paced-"))
    work.chmod(0o755)
    etcd = EtcdServer(work / "etcd", free_port(), free_port())
    etcd.start()
    # the backend reads django.conf.settings (defaults in settings/base.py); it never reaches
    # lockdb here (adopt_pg_sequence=False), but settings.ops wants the three URLs
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "settings.ops")
    os.environ.setdefault("DJANGO_SECRET_KEY", secrets.token_urlsafe(48))
    for name in ("LOCK_DATABASE_URL", "PAY_DATABASE_URL", "RAIL_DATABASE_URL"):
        os.environ.setdefault(name, "postgres://bench@127.0.0.1:1/unused")
    from lockserver.backends.etcd.backend import EtcdLockBackend
    from lockserver.etcd_client import EtcdClient

    backend = EtcdLockBackend(
        url=etcd.url, prefix="paced/", adopt_pg_sequence=False, housekeeping=False
    )
    client = EtcdClient(etcd.url)
    arms = {"dlock": _dlock(backend), "recipe": _recipe(client)}
    rows: dict[str, list[dict]] = {}
    try:
        for _round in range(ROUNDS):
            for pace in ("unpaced", "paced"):
                for arm, make in arms.items():
                    row = _drive(make, RATE if pace == "paced" else 0.0, etcd)
                    rows.setdefault(f"{arm} {pace}", []).append(row)
                    print(f"[etcd_paced] {arm} {pace}: {row}", flush=True)
    finally:
        backend.close()
        client.close()
        etcd.stop()
        shutil.rmtree(work, ignore_errors=True)
    ratios = {
        pace: statistics.median(
            d["etcd_cpu_ms_per_pair"] / r["etcd_cpu_ms_per_pair"]
            for d, r in zip(rows[f"dlock {pace}"], rows[f"recipe {pace}"], strict=True)
        )
        for pace in ("unpaced", "paced")
    }
    result = {
        "rate": RATE,
        "clients": CLIENTS,
        "rows": rows,
        "etcd_cpu_dlock_over_recipe": {pace: round(value, 3) for pace, value in ratios.items()},
    }
    print(json.dumps(result["etcd_cpu_dlock_over_recipe"]))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "etcd_paced.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    import sys

    run(sys.argv[1] if len(sys.argv) > 1 else ".run/bench")
