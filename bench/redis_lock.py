"""python-redis-lock on a private redis-server: the popular non-durable alternative.

Same shape as the lock benchmark: acquire+release pairs/s and p50/p99 per pair at 1/8/32
clients, each client on its own key (uncontended). Two Redis configurations: the default
(no persistence on the request path — what most deployments run) and AOF with
`appendfsync always` (a flush per write, the closest Redis gets to a durable lock).
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from devstack import free_port, wait_until

CLIENTS = (1, 8, 32)
CONFIGS = {
    "redis (no fsync)": ["--save", "", "--appendonly", "no"],
    "redis (AOF fsync always)": ["--save", "", "--appendonly", "yes", "--appendfsync", "always"],
}


def _server(args: list[str], workdir: Path) -> tuple[subprocess.Popen, int]:
    binary = shutil.which("redis-server") or "/usr/bin/redis-server"
    if not Path(binary).exists():
        raise RuntimeError(
            "redis-server not found: `WITH_REDIS=1 make sysdeps` or apt-get install redis-server"
        )
    port = free_port()
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(workdir), *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    import redis

    def up() -> bool:
        try:
            return bool(redis.Redis(port=port).ping())
        except redis.RedisError:
            return False

    wait_until(up, timeout=15, what=f"redis-server on {port}")
    return proc, port


def _measure(port: int, clients: int, seconds: float) -> dict:
    import redis
    import redis_lock

    pool = redis.ConnectionPool(host="127.0.0.1", port=port, max_connections=clients + 2)
    latencies: list[list[float]] = [[] for _ in range(clients)]
    stop = time.monotonic() + seconds
    barrier = threading.Barrier(clients)

    def client(i: int) -> None:
        conn = redis.Redis(connection_pool=pool)
        lock = redis_lock.Lock(conn, f"bench:{i}", expire=10)
        barrier.wait()
        mine = latencies[i]
        while time.monotonic() < stop:
            t = time.perf_counter()
            lock.acquire()
            lock.release()
            mine.append(time.perf_counter() - t)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - started
    flat = sorted(x for xs in latencies for x in xs)
    return {
        "clients": clients,
        "pairs": len(flat),
        "pairs_per_s": round(len(flat) / elapsed, 1),
        "p50_ms": round(statistics.median(flat) * 1000, 3) if flat else None,
        "p99_ms": round(flat[int(0.99 * (len(flat) - 1))] * 1000, 3) if flat else None,
    }


def run(out_dir: Path, *, seconds: float = 4.0) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for label, args in CONFIGS.items():
        workdir = Path(tempfile.mkdtemp(prefix="dlock-bench-redis-"))
        proc, port = _server(args, workdir)
        try:
            for clients in CLIENTS:
                rows.append({"backend": label, **_measure(port, clients, seconds)})
        finally:
            proc.terminate()
            proc.wait(10)
            shutil.rmtree(workdir, ignore_errors=True)
    data = {
        "name": "redis_lock",
        "library": "python-redis-lock 4.0.1 (redis-py 8.1.0)",
        "seconds_per_point": seconds,
        "rows": rows,
    }
    (out_dir / "redis_lock.json").write_text(json.dumps(data, indent=2))
    summary = [
        {
            "label": f"lock: {r['backend']}, {r['clients']} clients",
            "value": r["pairs_per_s"],
            "unit": "pairs/s",
            "detail": f"p50 {r['p50_ms']} ms, p99 {r['p99_ms']} ms",
        }
        for r in rows
    ]
    return {**data, "summary": summary}
