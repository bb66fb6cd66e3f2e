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
import asyncio
import contextlib
import json
import os
import secrets
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path

from bench.proc import cpu_seconds, rss_kib
from devstack import PROJECT, PgCluster, RoleProcess, free_port, manage, new_proof_keys, say

CLIENT_TIMEOUT_S = 15.0
# The production deadlines of the lock server (k8s/lock-server.yaml).
SERVER_ENV = {
    "SERVER_QUEUE_DEADLINE_MS": "100",
    "DB_QUEUE_DEADLINE_MS": "250",
    "DB_STATEMENT_TIMEOUT_MS": "600",
}


class Client:
    """A small asyncio HTTP/1.1 client: at most `connections` keep-alive connections.

    One event loop in one process costs far less CPU per request than threads under a GIL, so
    a single generator can keep a 2x schedule on the same 2 cores the server runs on. Like wrk2,
    it holds a fixed number of connections: a request due while all are busy waits for one, and
    that wait counts in its latency (measured from the schedule), not as a new connection —
    opening thousands of sockets would measure the kernel's SYN backlog, not the server.
    """

    def __init__(self, url: str, connections: int = 256):
        host, port = url.split("//", 1)[1].split(":")
        self.host, self.port = host, int(port)
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self.connections = connections
        self._slots: asyncio.Semaphore | None = None
        self.opened = 0
        self.sequence = 0

    def _request(self) -> bytes:
        self.sequence += 1
        body = json.dumps({"ownerId": f"load-{self.sequence % 10_000}", "ttlMillis": 1000}).encode()
        head = (
            f"POST /v1/sessions HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        return head.encode() + body

    async def _exchange(self) -> tuple[int, bytes, bool]:
        while self.idle:  # skip connections the server closed while they were idle
            reader, writer = self.idle.pop()
            if not reader.at_eof() and not writer.is_closing():
                break
            writer.close()
        else:
            reader, writer = await asyncio.open_connection(self.host, self.port)
            self.opened += 1
        try:
            writer.write(self._request())
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            status = int(lines[0].split(" ", 2)[1])
            headers = {}
            for line in lines[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            if headers.get("transfer-encoding", "").lower() == "chunked":
                body = b""
                while size := int((await reader.readuntil(b"\r\n")).strip(), 16):
                    body += (await reader.readexactly(size + 2))[:-2]
                await reader.readuntil(b"\r\n")
            else:
                body = await reader.readexactly(int(headers.get("content-length", "0")))
        except BaseException:
            writer.close()
            raise
        keep = headers.get("connection", "").lower() != "close"
        if keep:
            self.idle.append((reader, writer))
        else:
            writer.close()
        return status, body, keep

    async def one(self) -> tuple[int, str | None, bool, float]:
        """(status, code, retryAfterMillis present, seconds on the wire); status 0 = hang or
        transport error. The wait for a free connection is not in the seconds (see open_loop)."""
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.connections)
        async with self._slots:
            started = time.monotonic()
            try:
                status, raw, _ = await asyncio.wait_for(self._exchange(), CLIENT_TIMEOUT_S)
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
                # OSError covers TimeoutError (the client deadline) and refused/reset connections
                return 0, None, False, time.monotonic() - started
        elapsed = time.monotonic() - started
        if status < 400:
            return status, None, False, elapsed
        try:
            payload = json.loads(raw)
        except ValueError:
            return status, "NOT_JSON", False, elapsed
        return status, payload.get("code"), "retryAfterMillis" in payload, elapsed

    def close(self) -> None:
        for _, writer in self.idle:
            writer.close()
        self.idle.clear()


def closed_loop(url: str, concurrency: int, seconds: float) -> dict:
    async def main() -> list:
        client = Client(url)
        stop = time.monotonic() + seconds
        results: list[tuple[int, str | None, bool, float]] = []

        async def worker() -> None:
            while time.monotonic() < stop:
                results.append(await client.one())

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        client.close()
        return results

    results = asyncio.run(main())
    ok = [r for r in results if 200 <= r[0] < 300]
    latencies = sorted(r[3] for r in ok) or [0.0]
    return {
        "concurrency": concurrency,
        "ok_per_s": round(len(ok) / seconds, 1),
        "p50_ms": round(statistics.median(latencies) * 1000, 1),
        "p99_ms": round(latencies[int(len(latencies) * 0.99) - 1] * 1000, 1),
        "statuses": dict(Counter(str(r[0]) for r in results)),
    }


def capacity(url: str, seconds: float) -> tuple[float, list[dict]]:
    steps = [closed_loop(url, c, seconds) for c in (1, 4, 8, 16, 32)]
    return max(s["ok_per_s"] for s in steps), steps


def _p50_p99_max_ms(seconds: list[float]) -> list[float]:
    ordered = sorted(seconds)
    picks = (ordered[len(ordered) // 2], ordered[int(len(ordered) * 0.99) - 1], ordered[-1])
    return [round(value * 1000, 1) for value in picks]


def open_loop(url: str, rate: float, seconds: float, pid: int) -> dict:
    """Requests start on schedule whatever the server does (no coordinated omission).

    Latency is measured from the *scheduled* start; `send_lateness` is how far behind schedule
    the generator itself fell (it must stay small for the offered rate to be real).
    """
    memory: list[int] = []
    results: list[tuple[int, str | None, bool, float, float]] = []
    client = Client(url, connections=1024)

    async def fire(scheduled: float) -> None:
        lateness = time.monotonic() - scheduled
        status, code, retry_after, on_wire = await client.one()
        since_schedule = time.monotonic() - scheduled
        results.append((status, code, retry_after, since_schedule, lateness, on_wire))

    async def sample_memory(stop: asyncio.Event) -> None:
        while not stop.is_set():
            memory.append(rss_kib(pid))
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.5)

    async def main() -> tuple[float, float, int]:
        stop = asyncio.Event()
        sampler = asyncio.create_task(sample_memory(stop))
        interval = 1.0 / rate
        total = int(rate * seconds)
        tasks = []
        cpu_before = cpu_seconds(pid)
        started = time.monotonic()
        peak_in_flight = 0
        for i in range(total):
            scheduled = started + i * interval
            delay = scheduled - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(fire(scheduled)))
            peak_in_flight = max(peak_in_flight, len(tasks) - len(results))
        sent_window = time.monotonic() - started
        await asyncio.gather(*tasks)
        cpu = cpu_seconds(pid) - cpu_before
        stop.set()
        await sampler
        client.close()
        return sent_window, cpu / (time.monotonic() - started), peak_in_flight

    client_cpu_before = time.process_time()
    sent_window, server_cores, peak = asyncio.run(main())
    client_cpu = time.process_time() - client_cpu_before
    codes = Counter(f"{r[0]} {r[1] or ''}".strip() for r in results)
    overloaded = [r for r in results if r[0] == 503]
    p50, p99, worst = _p50_p99_max_ms([r[3] for r in results])
    return {
        "offered_per_s": round(rate, 1),
        "requests": len(results),
        "schedule_window_s": round(seconds, 1),
        "sent_per_s": round(len(results) / sent_window, 1),
        "send_lateness_p50_p99_max_ms": _p50_p99_max_ms([r[4] for r in results]),
        "peak_in_flight": peak,
        "connections_max": client.connections,
        "connections_opened": client.opened,
        "generator_cpu_s": round(client_cpu, 1),
        "server_cores_busy": round(server_cores, 2),
        "answers": dict(codes),
        "ok_per_s": round(sum(1 for r in results if 200 <= r[0] < 300) / seconds, 1),
        "errors_500": sum(1 for r in results if r[0] >= 500 and r[0] not in (503, 504)),
        "hangs": sum(1 for r in results if r[0] == 0 and r[5] >= CLIENT_TIMEOUT_S),
        "transport_errors": sum(1 for r in results if r[0] == 0 and r[5] < CLIENT_TIMEOUT_S),
        "503_without_retry_after": sum(1 for r in overloaded if not r[2]),
        "not_json": sum(1 for r in results if r[1] == "NOT_JSON"),
        "p50_ms": p50,
        "p99_ms": p99,
        "max_ms": worst,
        "on_wire_p50_p99_max_ms": _p50_p99_max_ms([r[5] for r in results]),
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
            "DLOCK_PROOF_KEYS": new_proof_keys(),
            "DJANGO_DEBUG": "false",
            "LOCK_BACKEND": "pg",
            **SERVER_ENV,
        }
        manage(["migrate", "--no-input", "-v", "0"], env, role="lockserver")
        report: dict = {"server_env": SERVER_ENV, "cpus": os.cpu_count()}
        proc = start_role(env, {}, work)
        try:
            closed_loop(proc.url, 8, 2.0)  # warm-up
            rss_before = rss_kib(proc.process.pid)
            best, steps = capacity(proc.url, seconds)
            report["layout"] = "1 process x gthread 32 threads (production default)"
            report["capacity_ok_per_s"] = best
            report["capacity_steps"] = steps
            say(f"capacity {best}/s; overload at {2 * best:.0f}/s for {overload_s:.0f} s")
            report["overload"] = open_loop(proc.url, 2 * best, overload_s, proc.process.pid)
            time.sleep(2)
            report["after"] = closed_loop(proc.url, 4, 2.0)
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
                    closed_loop(proc.url, 8, 2.0)
                    best, steps = capacity(proc.url, seconds)
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
