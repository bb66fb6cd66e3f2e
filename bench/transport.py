"""The HTTP client transport's CPU per call, two trees interleaved in one run: `dlock.http`'s
`exchange` (a pooled keep-alive POST with a JSON body, the executor's and lock client's hop)
and `send_once` (a one-shot POST, the rail forward) against one loopback HTTP/1.1 peer.

    python -m bench --only transport [--before 2510dc8] [--after <rev>]

Each tree (checked out as `bench.compare` does) gets a worker process run from that tree; the
peer (the standard library's threading HTTP server, keep-alive, a small JSON answer) runs in
this process, so the workers' CPU is the client's alone (`time.thread_time` around the calls).
Per round (BENCH_TRANSPORT_ROUNDS, default 15) and arm: BENCH_TRANSPORT_CALLS (default 1000)
calls in each tree, the first tree alternating between rounds; ratios are per round, then the
median. Writes `<out>/transport.json`. `bench.compare` runs it too.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from bench.compare import tree_for
from bench.rounds import median, rotated
from devstack import PYTHON, bound_listener

BEFORE = os.environ.get("BENCH_TRANSPORT_BEFORE", "2510dc8")
ROUNDS = int(os.environ.get("BENCH_TRANSPORT_ROUNDS", "15"))
CALLS = int(os.environ.get("BENCH_TRANSPORT_CALLS", "1000"))
ARMS = ("exchange", "send_once")
# Runs inside the tree under test; only names both trees have.
WORKER = r"""
import json, sys, time
from dlock.budgets import Budget
from dlock.http import exchange, pool_for, send_once
url, hop = sys.argv[1], Budget(1.0, 2.0, 0, "bench")
pool = pool_for(url)  # as dlock's clients call it: each origin's pool held by the caller
arms = {
    "exchange": lambda: exchange("POST", url + "/v1/locks/k", hop=hop, owner_id="bench",
                                 json_body={"ttl_s": 5}, pool=pool),
    "send_once": lambda: send_once("POST", url + "/rail", connect_s=1.0, read_s=2.0,
                                   body=b'{"amount": 1}',
                                   headers={"Content-Type": "application/json"}),
}
for line in sys.stdin:
    command = json.loads(line)
    call = arms[command["arm"]]
    for _ in range(20):
        call()
    started = time.thread_time()
    for _ in range(command["calls"]):
        call()
    used = time.thread_time() - started
    print(json.dumps({"us_per_call": round(used / command["calls"] * 1e6, 1)}), flush=True)
"""


class _Peer(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive unless the request says close
    disable_nagle_algorithm = True  # the head and the body are two writes

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = b'{"status":"ok","token":42}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def _peer() -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Peer, bind_and_activate=False)
    server.socket.close()
    server.socket = bound_listener()
    server.server_address = server.socket.getsockname()
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _worker(tree: Path, url: str) -> subprocess.Popen:
    return subprocess.Popen(
        [PYTHON, "-c", WORKER, url],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def _ask(worker: subprocess.Popen, arm: str, calls: int) -> float:
    assert worker.stdin is not None and worker.stdout is not None
    worker.stdin.write(json.dumps({"arm": arm, "calls": calls}) + "\n")
    worker.stdin.flush()
    line = worker.stdout.readline()
    if not line:
        raise RuntimeError(f"transport worker exited ({worker.wait()})")
    return json.loads(line)["us_per_call"]


def run(
    out_dir: str | Path,
    *,
    before: str | None = None,
    after: str | None = None,
    rounds: int = ROUNDS,
    calls: int = CALLS,
) -> dict:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    trees = {
        "before": tree_for(before or BEFORE, out / "compare"),
        "after": tree_for(after, out / "compare"),
    }
    peer = _peer()
    url = f"http://127.0.0.1:{peer.server_address[1]}"
    workers = {name: _worker(tree, url) for name, (tree, _) in trees.items()}
    per: dict[str, dict[str, list[float]]] = {arm: {"before": [], "after": []} for arm in ARMS}
    try:
        for index in range(rounds):
            for arm in ARMS:
                for name in rotated(("before", "after"), index):
                    per[arm][name].append(_ask(workers[name], arm, calls))
    finally:
        for worker in workers.values():
            assert worker.stdin is not None
            worker.stdin.close()
            worker.wait(60)
        peer.shutdown()
        peer.server_close()
    result: dict = {}
    for arm, rows in per.items():
        ratios = [round(a / b, 3) for a, b in zip(rows["after"], rows["before"], strict=True)]
        result[arm] = {
            "before_us": median(rows["before"]),
            "after_us": median(rows["after"]),
            "after_over_before": median(ratios),
            "rounds": {**rows, "ratios": ratios},
        }
        print(
            f"[bench] transport {arm}: client CPU per call {result[arm]['before_us']} →"
            f" {result[arm]['after_us']} µs, median of per-round ratios"
            f" {result[arm]['after_over_before']}×",
            flush=True,
        )
    data = {
        "name": "transport",
        "trees": {name: {"path": str(tree), "commit": sha} for name, (tree, sha) in trees.items()},
        "workload": f"{rounds} interleaved rounds × {calls} calls per arm and tree, loopback"
        " keep-alive peer; client CPU (thread time) per call",
        "arms": result,
        "loadavg_1m": round(os.getloadavg()[0], 2),
    }
    (out / "transport.json").write_text(json.dumps(data, indent=2) + "\n")
    return data
