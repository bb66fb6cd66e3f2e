"""The HTTP client transport's CPU per call, two trees interleaved: `dlock.http.exchange` (a
keep-alive POST with a JSON body on the caller's pool: the lock client's and executor's hop) and
`send_once` (a one-shot POST: the rail forward) against one loopback HTTP/1.1 peer (the standard
library's, in this process, so a worker's thread time is the client's CPU alone). `--only
transport [--before 2510dc8] [--after REV]`; `--only compare` runs it too. A worker process per
tree (checked out as `bench.compare` does); per round (BENCH_TRANSPORT_ROUNDS, default 15) and
arm BENCH_TRANSPORT_CALLS (1000) calls in each tree, the first alternating; the median of the
per-round ratios. Writes `<out>/transport.json`."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from bench.compare import tree_for
from bench.rounds import median, rotated
from devstack.common import PYTHON, bound_listener

BEFORE = os.environ.get("BENCH_TRANSPORT_BEFORE", "2510dc8")
ROUNDS = int(os.environ.get("BENCH_TRANSPORT_ROUNDS", "15"))
CALLS = int(os.environ.get("BENCH_TRANSPORT_CALLS", "1000"))
ARMS = ("exchange", "send_once")
# Runs in the tree under test (`-c` puts its cwd first on sys.path); names both trees have.
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
    arm, calls = json.loads(line)
    for _ in range(20): arms[arm]()  # warm up
    started = time.thread_time()
    for _ in range(calls): arms[arm]()
    print(round((time.thread_time() - started) / calls * 1e6, 1), flush=True)
"""


class _Peer(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive unless the request says close
    disable_nagle_algorithm = True  # the head and the body are two writes

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "26")
        self.end_headers()
        self.wfile.write(b'{"status":"ok","token":42}')

    def log_message(self, *args: object) -> None: ...


def _ask(worker: subprocess.Popen, arm: str, calls: int) -> float:
    assert worker.stdin is not None and worker.stdout is not None
    worker.stdin.write(json.dumps([arm, calls]) + "\n")
    worker.stdin.flush()
    line = worker.stdout.readline()
    if not line:
        raise RuntimeError(f"transport worker exited ({worker.wait()})")
    return float(line)


def run(out_dir: str | Path, *, before: str | None = None, after: str | None = None) -> dict:
    out = Path(out_dir)
    revs = {"before": before or BEFORE, "after": after}
    trees = {name: tree_for(rev, out / "compare") for name, rev in revs.items()}
    peer = ThreadingHTTPServer(("127.0.0.1", 0), _Peer, bind_and_activate=False)
    peer.socket.close()
    peer.socket = bound_listener()  # a reserved port, never an ephemeral one
    threading.Thread(target=peer.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{peer.socket.getsockname()[1]}"
    pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "text": True}
    workers = {
        name: subprocess.Popen([PYTHON, "-c", WORKER, url], cwd=tree, **pipes)
        for name, (tree, _) in trees.items()
    }
    per: dict[str, dict[str, list]] = {arm: {"before": [], "after": []} for arm in ARMS}
    try:
        for index in range(ROUNDS):
            for arm in ARMS:
                for name in rotated(("before", "after"), index):
                    per[arm][name].append(_ask(workers[name], arm, CALLS))
    finally:
        for worker in workers.values():
            worker.communicate(timeout=60)  # its stdin closed: it ends
        peer.shutdown()
        peer.server_close()
    arms = {}
    for arm, rows in per.items():
        rows["ratios"] = [
            round(a / b, 3) for a, b in zip(rows["after"], rows["before"], strict=True)
        ]
        us = {f"{k}_us": median(rows[k]) for k in ("before", "after")}
        arms[arm] = {**us, "after_over_before": median(rows["ratios"]), "rounds": rows}
        print(f"[bench] transport {arm}: CPU per call {us}, {median(rows['ratios'])}× (median)")
    data = {
        "name": "transport",
        "trees": {name: {"path": str(tree), "commit": sha} for name, (tree, sha) in trees.items()},
        "workload": f"{ROUNDS} interleaved rounds x {CALLS} calls per arm and tree, loopback"
        " keep-alive peer; client CPU (thread time) per call",
        "arms": arms,
        "loadavg_1m": round(os.getloadavg()[0], 2),
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "transport.json").write_text(json.dumps(data, indent=2) + "\n")
    return data
