"""gunicorn's own CPU per request: stock gthread against dlock's worker (issue 18).

Each arm is one gunicorn master (settings/gunicorn.py, the lock server's defaults: 1 worker x
32 threads, keep-alive 5 s) with a worker class, serving either bench/trivial_app.py (no
framework: what gunicorn alone costs) or the real lock-server role (`/health/live`, which runs
on the worker's monitoring pool, and a 404 from Django, which runs on the request pool). Every
server is up for the whole run; `CLIENTS` keep-alive clients (raw sockets, one request in
flight each) drive one of them for a block of `BLOCK_S` seconds, then the next, round after
round (A, B, A, B: the box is shared, so each arm sees the same load over the run). CPU per
request is the utime+stime of the gunicorn process tree (bench.proc.tree_cpu_seconds) over the
block, divided by the requests answered in it; the medians over rounds are reported, and each
arm's median ratio to the first arm within a round (steadier when the box's load drifts).

    python -m bench.worker [out_dir]    # default .run/bench; writes worker.json

Environment: BENCH_WORKER_ROUNDS (default 5), BENCH_WORKER_BLOCK_S (3), BENCH_WORKER_CLIENTS (8),
BENCH_WORKER_CLASSES (`name=dotted.Class,...`; default stock=gthread and
dlock=dlock.serving.DrainingThreadWorker; PYTHONPATH reaches the servers, so a copy of an older
worker can be one arm), BENCH_WORKER_TARGETS (`trivial,live,notfound`).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench import credentials
from bench.proc import tree_cpu_seconds
from devstack import PgCluster, RoleProcess, free_port, manage

ROUNDS = int(os.environ.get("BENCH_WORKER_ROUNDS", "5"))
BLOCK_S = float(os.environ.get("BENCH_WORKER_BLOCK_S", "3"))
CLIENTS = int(os.environ.get("BENCH_WORKER_CLIENTS", "8"))
DEFAULT_CLASSES = "stock=gthread,dlock=dlock.serving.DrainingThreadWorker"
# target: (app module or "" for the lock-server role, request path)
TARGETS = {
    "trivial": ("bench.trivial_app", "/"),
    "live": ("", "/health/live"),
    "notfound": ("", "/v1/no-such-endpoint"),
}


def _classes() -> dict[str, str]:
    spec = os.environ.get("BENCH_WORKER_CLASSES") or DEFAULT_CLASSES
    return dict(item.split("=", 1) for item in spec.split(",") if item)


def _targets() -> list[str]:
    spec = os.environ.get("BENCH_WORKER_TARGETS") or ",".join(TARGETS)
    return [name for name in spec.split(",") if name]


def _read_response(sock: socket.socket, pending: bytearray) -> None:
    """Read one response (Content-Length framed) off `sock`; leftovers stay in `pending`."""
    while True:
        end = pending.find(b"\r\n\r\n")
        if end >= 0:
            head = bytes(pending[:end]).lower()
            start = head.find(b"content-length:")
            length = int(head[start + 15 :].split(b"\r\n", 1)[0]) if start >= 0 else 0
            if len(pending) >= end + 4 + length:
                del pending[: end + 4 + length]
                return
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("server closed the connection")
        pending += chunk


def _drive(port: int, path: str, seconds: float, pid: int) -> dict:
    """`CLIENTS` keep-alive clients, one request in flight each, for `seconds`."""
    request = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()
    counts = [0] * CLIENTS
    errors: list[str] = []
    stop = threading.Event()
    start = threading.Barrier(CLIENTS + 1)

    def client(index: int) -> None:
        sock = socket.create_connection(("127.0.0.1", port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        pending = bytearray()
        start.wait()
        try:
            while not stop.is_set():
                sock.sendall(request)
                _read_response(sock, pending)
                counts[index] += 1
        except OSError as exc:
            errors.append(repr(exc))
        finally:
            sock.close()

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(CLIENTS)]
    for thread in threads:
        thread.start()
    start.wait()
    cpu_before, wall_before = tree_cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join(10)
    cpu = tree_cpu_seconds(pid) - cpu_before
    wall = time.monotonic() - wall_before
    requests = sum(counts)
    return {
        "requests": requests,
        "requests_per_s": round(requests / wall, 1),
        "cpu_ms_per_request": round(cpu * 1000 / requests, 4) if requests else None,
        "cores_busy": round(cpu / wall, 2),
        "errors": errors[:3],
    }


def run(out_dir: str | Path = ".run/bench") -> dict:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="dlock-bench-worker-"))
    work.chmod(0o755)
    classes, targets = _classes(), _targets()
    cluster: PgCluster | None = None
    servers: dict[tuple[str, str], RoleProcess] = {}
    try:
        role_env: dict[str, str] = {}
        if any(not TARGETS[t][0] for t in targets):
            cluster = PgCluster(work / "pg", free_port(), fast=True)  # no SQL is measured
            cluster.start()
            role_env = {
                "DJANGO_SECRET_KEY": secrets.token_urlsafe(48),
                "DJANGO_DEBUG": "false",
                "LOCK_BACKEND": "pg",
                "LOCK_DATABASE_URL": cluster.create_database("bench_workerdb"),
                "DLOCK_LOG_LEVEL": "WARNING",
                **credentials.server_env(),
            }
            manage(["migrate", "--no-input", "-v", "0"], role_env, role="lockserver")
        apps = {app for app, _ in (TARGETS[t] for t in targets)}
        for arm, worker_class in classes.items():
            for app in apps:
                env = {**role_env, "GUNICORN_WORKER_CLASS": worker_class}
                servers[(arm, app)] = RoleProcess(
                    "lockserver",
                    free_port(),
                    env,
                    work / f"{arm}-{app or 'role'}.log",
                    **({"app": app} if app else {}),
                ).start()
        samples: dict[str, dict[str, list[dict]]] = {t: {a: [] for a in classes} for t in targets}
        load_before = os.getloadavg()[0]
        for _ in range(ROUNDS):
            for target in targets:
                app, path = TARGETS[target]
                for arm in classes:
                    server = servers[(arm, app)]
                    samples[target][arm].append(
                        _drive(server.port, path, BLOCK_S, server.process.pid)
                    )
        rows = {}
        for target, arms in samples.items():
            rows[target] = {}
            first = next(iter(arms.values()))
            for arm, blocks in arms.items():
                # Each round's blocks ran back to back: the ratio within a round is steadier
                # than the ratio of medians when the box's load drifts.
                paired = [
                    b["cpu_ms_per_request"] / a["cpu_ms_per_request"]
                    for a, b in zip(first, blocks, strict=True)
                    if a["cpu_ms_per_request"] and b["cpu_ms_per_request"]
                ]
                per = [b["cpu_ms_per_request"] for b in blocks if b["cpu_ms_per_request"]]
                rows[target][arm] = {
                    "cpu_ms_per_request_median": round(statistics.median(per), 4),
                    "cpu_ms_per_request_each": per,
                    "paired_ratio_to_first_arm_median": round(statistics.median(paired), 3),
                    "requests_per_s_median": statistics.median(b["requests_per_s"] for b in blocks),
                    "cores_busy_median": statistics.median(b["cores_busy"] for b in blocks),
                    "errors": sorted({e for b in blocks for e in b["errors"]})[:3],
                }
        result = {
            "name": "worker",
            "server": "gunicorn (settings/gunicorn.py, ROLE=lockserver: 1 worker x 32 threads)",
            "clients": CLIENTS,
            "rounds": ROUNDS,
            "block_s": BLOCK_S,
            "classes": classes,
            "targets": {
                t: TARGETS[t][1] + (f" ({TARGETS[t][0]})" if TARGETS[t][0] else "") for t in targets
            },
            "loadavg_before_after": [round(load_before, 2), round(os.getloadavg()[0], 2)],
            "rows": rows,
        }
    finally:
        for server in servers.values():
            server.stop()
        if cluster is not None:
            cluster.stop("immediate")
        shutil.rmtree(work, ignore_errors=True)
    (out / "worker.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def main() -> None:
    result = run(sys.argv[1] if len(sys.argv) > 1 else ".run/bench")
    for target, arms in result["rows"].items():
        line = ", ".join(
            f"{arm} {row['cpu_ms_per_request_median']:.3f} ms"
            f" ({row['requests_per_s_median']:.0f}/s, {row['paired_ratio_to_first_arm_median']}x)"
            for arm, row in arms.items()
        )
        print(f"{target:9} {result['targets'][target]}: {line}")
    print(f"load {result['loadavg_before_after']}")


if __name__ == "__main__":
    main()
