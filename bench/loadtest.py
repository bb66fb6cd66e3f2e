"""Capacity and overload of one role under the real gunicorn config (`python -m bench.loadtest`).

1. Capacity: closed loop at rising concurrency; capacity = the best rate of successful answers.
2. Overload: open loop at 2x that rate for a fixed time. Every answer is counted by status and
   code; 503s must be OVERLOADED with retryAfterMillis, never a 500, and no request may hang
   (client timeout). Memory (RSS of the gunicorn processes) is sampled throughout.
3. Optional `--compare`: capacity of other worker layouts (2 processes x gthread, sync workers).

Its own durable PostgreSQL cluster (fsync on) on free ports; bounded in time; results to
.run/bench/loadtest.json. The workload is lock-server L1 (POST /v1/sessions: one INSERT + commit).
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing as mp
import os
import secrets
import statistics
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

from dlock.devstack import PROJECT, PgCluster, RoleProcess, free_port, manage, say

CLIENT_TIMEOUT_S = 15.0
# The production deadlines of the lock server (k8s/lock-server.yaml).
SERVER_ENV = {"DB_QUEUE_DEADLINE_MS": "250", "DB_STATEMENT_TIMEOUT_MS": "600"}


def rss_kib(pid: int) -> int:
    """Resident memory of a process and its children (gunicorn master + workers)."""
    total = 0
    pids = [pid]
    children = Path(f"/proc/{pid}/task/{pid}/children")
    if children.exists():
        pids += [int(p) for p in children.read_text().split()]
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except FileNotFoundError:
            continue
    return total


class Client:
    """One keep-alive http.client connection per thread: cheap enough to load a 2-core box."""

    def __init__(self, url: str):
        self.url = url
        self.host, port = url.split("//", 1)[1].split(":")
        self.port = int(port)
        self.local = threading.local()

    def connection(self) -> http.client.HTTPConnection:
        if getattr(self.local, "conn", None) is None:
            self.local.conn = http.client.HTTPConnection(
                self.host, self.port, timeout=CLIENT_TIMEOUT_S
            )
        return self.local.conn

    def one(self) -> tuple[int, str | None, bool, float]:
        """(status, code, retryAfterMillis present, seconds); status 0 = hang/transport error."""
        body = json.dumps(
            {"ownerId": f"load-{threading.get_ident() % 10000}", "ttlMillis": 1000}
        ).encode()
        started = time.monotonic()
        try:
            conn = self.connection()
            conn.request(
                "POST", "/v1/sessions", body=body, headers={"Content-Type": "application/json"}
            )
            response = conn.getresponse()
            raw = response.read()
            status = response.status
            if response.getheader("Connection", "").lower() == "close":
                conn.close()
                self.local.conn = None
        except (OSError, http.client.HTTPException):
            if getattr(self.local, "conn", None) is not None:
                self.local.conn.close()
            self.local.conn = None
            return 0, None, False, time.monotonic() - started
        elapsed = time.monotonic() - started
        if status < 400:
            return status, None, False, elapsed
        try:
            payload = json.loads(raw)
        except ValueError:
            return status, "NOT_JSON", False, elapsed
        return status, payload.get("code"), "retryAfterMillis" in payload, elapsed


def closed_loop(client: Client, concurrency: int, seconds: float) -> dict:
    stop = time.monotonic() + seconds
    results: list[tuple[int, str | None, bool, float]] = []
    lock = threading.Lock()

    def worker() -> None:
        while time.monotonic() < stop:
            outcome = client.one()
            with lock:
                results.append(outcome)

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ok = [r for r in results if 200 <= r[0] < 300]
    latencies = sorted(r[3] for r in ok) or [0.0]
    return {
        "concurrency": concurrency,
        "ok_per_s": round(len(ok) / seconds, 1),
        "p50_ms": round(statistics.median(latencies) * 1000, 1),
        "p99_ms": round(latencies[int(len(latencies) * 0.99) - 1] * 1000, 1),
        "statuses": dict(Counter(str(r[0]) for r in results)),
    }


def capacity(client: Client, seconds: float) -> tuple[float, list[dict]]:
    steps = [closed_loop(client, c, seconds) for c in (1, 4, 8, 16, 32)]
    return max(s["ok_per_s"] for s in steps), steps


def _schedule(url: str, rate: float, seconds: float, start_at: float, in_flight: int) -> list:
    """One client process: fire `rate`/s from `start_at` (time.time) for `seconds`."""
    client = Client(url)
    interval = 1.0 / rate
    results: list[tuple[int, str | None, bool, float, float]] = []
    lock = threading.Lock()

    def fire(scheduled: float) -> None:
        outcome = client.one()
        with lock:
            results.append((*outcome, time.monotonic() - scheduled - outcome[3]))

    start = time.monotonic() + max(0.0, start_at - time.time())
    with ThreadPoolExecutor(max_workers=in_flight) as pool:
        for i in range(int(rate * seconds)):
            scheduled = start + i * interval
            delay = scheduled - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            pool.submit(fire, scheduled)
    return results


def open_loop(url: str, rate: float, seconds: float, pid: int, processes: int = 3) -> dict:
    """Requests start on schedule whatever the server does (no coordinated omission); the
    schedule is split over several client processes so the client's GIL is not the limit."""
    memory: list[int] = []
    start_at = time.time() + 1.0
    with ProcessPoolExecutor(max_workers=processes, mp_context=mp.get_context("fork")) as pool:
        futures = [
            pool.submit(_schedule, url, rate / processes, seconds, start_at, 256 // processes)
            for _ in range(processes)
        ]
        while not all(f.done() for f in futures):
            memory.append(rss_kib(pid))
            time.sleep(0.5)
        results = [r for f in futures for r in f.result()]
    wall = time.time() - start_at
    codes = Counter(f"{r[0]} {r[1] or ''}".strip() for r in results)
    overloaded = [r for r in results if r[0] == 503]
    latencies = sorted(r[3] for r in results)
    lateness = sorted(r[4] for r in results)
    return {
        "offered_per_s": round(rate, 1),
        "client_processes": processes,
        "requests": len(results),
        "wall_s": round(wall, 1),
        "sent_per_s": round(len(results) / wall, 1),
        "answers": dict(codes),
        "ok_per_s": round(sum(1 for r in results if 200 <= r[0] < 300) / wall, 1),
        "errors_500": sum(1 for r in results if r[0] >= 500 and r[0] not in (503, 504)),
        "hangs_or_transport_errors": sum(1 for r in results if r[0] == 0),
        "503_without_retry_after": sum(1 for r in overloaded if not r[2]),
        "not_json": sum(1 for r in results if r[1] == "NOT_JSON"),
        "p50_ms": round(latencies[len(latencies) // 2] * 1000, 1),
        "p99_ms": round(latencies[int(len(latencies) * 0.99) - 1] * 1000, 1),
        "max_ms": round(latencies[-1] * 1000, 1),
        "client_lateness_p99_ms": round(lateness[int(len(lateness) * 0.99) - 1] * 1000, 1),
        "rss_kib_min_max": [min(memory or [0]), max(memory or [0])],
    }


def start_role(env: dict[str, str], extra: dict[str, str], logdir: Path) -> RoleProcess:
    proc = RoleProcess("lockserver", free_port(), {**env, **extra}, logdir / "lockserver.log")
    return proc.start()


def run(out_dir: Path, *, seconds: float = 4.0, overload_s: float = 12.0, compare: bool = False):
    out_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="dlock-loadtest-"))
    work.chmod(0o755)
    cluster = PgCluster(work / "pg", free_port(), fast=False)
    cluster.start()
    try:
        env = {
            "LOCK_DATABASE_URL": cluster.create_database("lockdb"),
            "DJANGO_SECRET_KEY": secrets.token_urlsafe(48),
            "DJANGO_DEBUG": "false",
            "LOCK_BACKEND": "pg",
            **SERVER_ENV,
        }
        manage(["migrate", "--no-input", "-v", "0"], env, role="lockserver")
        report: dict = {"server_env": SERVER_ENV, "cpus": os.cpu_count()}
        proc = start_role(env, {}, work)
        try:
            client = Client(proc.url)
            closed_loop(client, 8, 2.0)  # warm-up
            rss_before = rss_kib(proc.process.pid)
            best, steps = capacity(client, seconds)
            report["layout"] = "1 process x gthread 32 threads (production default)"
            report["capacity_ok_per_s"] = best
            report["capacity_steps"] = steps
            say(f"capacity {best}/s; overload at {2 * best:.0f}/s for {overload_s:.0f} s")
            report["overload"] = open_loop(proc.url, 2 * best, overload_s, proc.process.pid)
            time.sleep(2)
            report["after"] = closed_loop(client, 4, 2.0)
            report["rss_kib_before_after"] = [rss_before, rss_kib(proc.process.pid)]
        finally:
            proc.stop()
        if compare:
            layouts = {
                "2 processes x gthread 16 threads": {
                    "GUNICORN_WORKERS": "2",
                    "GUNICORN_THREADS": "16",
                },
                "4 sync workers": {"GUNICORN_WORKERS": "4", "GUNICORN_WORKER_CLASS": "sync"},
                "1 process x gthread 8 threads": {"GUNICORN_THREADS": "8"},
            }
            report["compare"] = {}
            for name, extra in layouts.items():
                proc = start_role(env, extra, work)
                try:
                    client = Client(proc.url)
                    closed_loop(client, 8, 2.0)
                    best, steps = capacity(client, seconds)
                    report["compare"][name] = {"capacity_ok_per_s": best, "steps": steps}
                    say(f"{name}: capacity {best}/s")
                finally:
                    proc.stop()
    finally:
        cluster.stop()
    (out_dir / "loadtest.json").write_text(json.dumps(report, indent=2))
    return report


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.loadtest")
    parser.add_argument("--seconds", type=float, default=4.0, help="per capacity step")
    parser.add_argument("--overload-seconds", type=float, default=12.0)
    parser.add_argument("--compare", action="store_true", help="also measure other layouts")
    parser.add_argument("--out", default=str(PROJECT / ".run" / "bench"))
    args = parser.parse_args()
    report = run(
        Path(args.out),
        seconds=args.seconds,
        overload_s=args.overload_seconds,
        compare=args.compare,
    )
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
