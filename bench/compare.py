"""Before/after of two trees in one run (issue 25 item 8): server CPU per payout (every role's
process tree and PostgreSQL; the proxy too where the tree's stack puts one in front), executor
CPU per payout, payouts/s, and each tree's own like-for-like floor.

    python -m bench --only compare --before 55d13fe [--after <rev>]
    make bench BENCH_ARGS="--only compare --before 55d13fe"

`--before` (required) and `--after` (default: this working tree) are git revisions; each one
that is not this tree is checked out with `git worktree add --detach` under
`.run/bench/compare/<sha>` (kept for the next run; `git worktree remove` it when done). Each tree
gets a worker process, run from that tree with this virtualenv's Python, that starts the tree's
own durable private stack (`experiment.stack.private_stack`, fsync on) and then waits for
commands: so both stacks are up for the whole run and only the measured work alternates. Per
round (BENCH_COMPARE_ROUNDS, default 9): a dlock payout point in `before`, then in `after`
(`bench.e2e._point`: one executor process × BENCH_COMPARE_CONCURRENCY, default 32, rail 0, on
freshly seeded payouts planned for BENCH_COMPARE_POINT_S, default 20 s — handed to both trees as
their BENCH_E2E_POINT_S), then the floor in `before`, then in `after`
(`bench.payout_floor._floor_once`, the tree's own floor servers started through its own
`devstack.RoleProcess`, so behind the same proxy and gunicorn as that tree's dlock). The first
tree of each pair alternates between rounds. Ratios are per round, then the median.
Writes `<out>/compare.json`.

Why these defaults: a payout's server CPU is counted between the first and the last POSTED
payout of the point. The e2e matrix's 8 s plan (256 payouts at 1 × 32) is a window of about 3 s,
and this box's speed drifts within a minute (rounds where every role, PostgreSQL too, costs a
third more): 20 s plans (640 payouts, an 8 s window) over 9 rounds narrow the spread between
runs that 8 s plans over 5 rounds showed; they do not close it (every run: docs/performance.md
"Before / after").
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

from bench.rounds import median
from devstack.common import PROJECT, PYTHON

ROUNDS = int(os.environ.get("BENCH_COMPARE_ROUNDS", "9"))
POINT_S = os.environ.get("BENCH_COMPARE_POINT_S", "20")
CONCURRENCY = int(os.environ.get("BENCH_COMPARE_CONCURRENCY", "32"))
PREFIX = "@@compare "
# Runs inside the tree under test (cwd, sys.path[0]); only names both trees have.
WORKER = r"""
import json, os, sys, traceback
from pathlib import Path
sys.path.insert(0, os.getcwd())
from bench.__main__ import setup_django
setup_django()
from bench import e2e, payout_floor
from experiment.stack import private_stack

PREFIX = "@@compare "
base = Path(sys.argv[1])
logs = base / "logs"
logs.mkdir(parents=True, exist_ok=True)
stack, stop = private_stack(base / "stack", fast=False)
try:
    print(PREFIX + json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        command = json.loads(line)
        try:
            if command["cmd"] == "point":
                result = e2e._point(stack, processes=1, concurrency=command["concurrency"],
                                    latency_ms=0, logdir=logs, profile_dir=None)
            elif command["cmd"] == "floor":
                result = payout_floor._floor_once(stack, logdir=logs, payouts_s=e2e.POINT_S)
            else:
                break
            print(PREFIX + json.dumps({"result": result}, default=str), flush=True)
        except Exception as exc:
            print(PREFIX + json.dumps({"error": f"{type(exc).__name__}: {exc}",
                                       "trace": traceback.format_exc()[-2000:]}), flush=True)
finally:
    stop()
"""


def _git(*args: str, cwd: Path = PROJECT) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout.strip()


def tree_for(rev: str | None, root: Path) -> tuple[Path, str]:
    """(checkout, full sha) of `rev`; None is this working tree as it is (uncommitted too)."""
    if rev is None:
        return PROJECT, _git("rev-parse", "HEAD") + (
            "+dirty" if _git("status", "--porcelain") else ""
        )
    sha = _git("rev-parse", "--verify", f"{rev}^{{commit}}")
    checkout = root / sha[:12]
    if not (checkout / ".git").exists():
        root.mkdir(parents=True, exist_ok=True)
        _git("worktree", "add", "--detach", "--force", str(checkout), sha)
    return checkout, sha


class Worker:
    """One tree's stack, driven line by line."""

    def __init__(self, name: str, tree: Path, base: Path) -> None:
        self.name = name
        self.log = open(base / f"{name}-worker.log", "a")
        self.process = subprocess.Popen(
            [PYTHON, "-c", WORKER, str(base / name)],
            cwd=tree,
            env={**os.environ, "PYTHONPATH": str(tree), "BENCH_E2E_POINT_S": POINT_S},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
        )
        self.ready = self._answer(timeout=600)

    def _answer(self, timeout: float) -> dict:
        assert self.process.stdout is not None
        found: dict = {}

        def read() -> None:
            assert self.process.stdout is not None
            for line in self.process.stdout:
                if line.startswith(PREFIX):
                    found.update(json.loads(line[len(PREFIX) :]))
                    return
                self.log.write(line)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(timeout)
        if not found:
            raise RuntimeError(
                f"compare worker {self.name} gave no answer (exit {self.process.poll()});"
                f" see {self.log.name}"
            )
        return found

    def ask(self, cmd: str, **fields) -> dict:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({"cmd": cmd, **fields}) + "\n")
        self.process.stdin.flush()
        answer = self._answer(timeout=900)
        if "error" in answer:
            raise RuntimeError(f"{self.name} {cmd}: {answer['error']}\n{answer.get('trace', '')}")
        return answer["result"]

    def close(self) -> None:
        if self.process.poll() is None:
            assert self.process.stdin is not None
            try:
                self.process.stdin.write(json.dumps({"cmd": "stop"}) + "\n")
                self.process.stdin.close()
            except BrokenPipeError:
                pass
            try:
                self.process.wait(120)
            except subprocess.TimeoutExpired:
                self.process.terminate()
                self.process.wait(30)
        self.log.close()


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def _point_view(row: dict) -> dict:
    return {
        "payouts_per_s": row.get("payouts_per_s"),
        "cpu_ms_per_payout": row.get("cpu_ms_per_payout"),
        "executor_cpu_ms_per_payout": row.get("executor_cpu_ms_per_payout"),
        "loadavg_1m_at_start": row.get("loadavg_1m_at_start"),
        "posted": row.get("posted"),
        "payouts": row.get("payouts"),
    }


def summarise(rounds: list[dict]) -> dict:
    """Per-round after ÷ before (server CPU, executor CPU, payouts/s) and dlock ÷ floor per
    tree, and their medians."""
    per: dict[str, list[float | None]] = {
        "server_cpu_after_over_before": [],
        "executor_cpu_after_over_before": [],
        "payouts_per_s_after_over_before": [],
        "before_over_floor": [],
        "after_over_floor": [],
    }
    for one in rounds:
        b, a = one["before"]["point"], one["after"]["point"]
        bcpu = (b.get("cpu_ms_per_payout") or {}).get("total")
        acpu = (a.get("cpu_ms_per_payout") or {}).get("total")
        per["server_cpu_after_over_before"].append(_ratio(acpu, bcpu))
        per["executor_cpu_after_over_before"].append(
            _ratio(a.get("executor_cpu_ms_per_payout"), b.get("executor_cpu_ms_per_payout"))
        )
        per["payouts_per_s_after_over_before"].append(
            _ratio(a.get("payouts_per_s"), b.get("payouts_per_s"))
        )
        for tree, cpu in (("before", bcpu), ("after", acpu)):
            floor = (one[tree].get("floor") or {}).get("cpu_ms_per_payout") or {}
            per[f"{tree}_over_floor"].append(_ratio(cpu, floor.get("total")))
    return {**{k: median(v) for k, v in per.items()}, "rounds": per}


def run(
    out_dir: str | Path,
    *,
    before: str,
    after: str | None = None,
    rounds: int = ROUNDS,
    concurrency: int = CONCURRENCY,
    floor: bool = True,
) -> dict:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    checkouts = out / "compare"
    trees = {"before": tree_for(before, checkouts), "after": tree_for(after, checkouts)}
    base = Path(tempfile.mkdtemp(prefix="dlock-bench-compare-"))
    base.chmod(0o755)
    workers: dict[str, Worker] = {}
    done: list[dict] = []
    try:
        for name, (tree, _) in trees.items():
            workers[name] = Worker(name, tree, base)
        for index in range(rounds):
            order = ("before", "after") if index % 2 == 0 else ("after", "before")
            one: dict = {"round": index + 1, "order": list(order), "before": {}, "after": {}}
            for name in order:
                one[name]["point"] = _point_view(
                    workers[name].ask("point", concurrency=concurrency)
                )
            if floor:
                for name in order:
                    one[name]["floor"] = workers[name].ask("floor")
            one["loadavg_1m"] = round(os.getloadavg()[0], 2)
            done.append(one)
            print(
                f"[bench] compare round {index + 1}: server CPU per payout before"
                f" {one['before']['point']['cpu_ms_per_payout'].get('total')} ms, after"
                f" {one['after']['point']['cpu_ms_per_payout'].get('total')} ms"
                f" (load {one['loadavg_1m']})",
                flush=True,
            )
    finally:
        for worker in workers.values():
            worker.close()
    shutil.rmtree(base, ignore_errors=True)  # the workers' logs; on a failure they stay
    data = {
        "name": "compare",
        "trees": {name: {"path": str(tree), "commit": sha} for name, (tree, sha) in trees.items()},
        "workload": f"1 executor process × {concurrency}, rail 0, durable PostgreSQL, points"
        f" planned for {POINT_S} s; floor: the tree's own bench.payout_floor servers",
        "interleaved": f"{rounds} rounds of (point, point, floor, floor), the first tree"
        " alternating between rounds",
        "goal_25": "server CPU per payout after <= 1.15x before",
        "ratios": summarise(done),
        "rounds": done,
    }
    (out / "compare.json").write_text(json.dumps(data, indent=2, default=str) + "\n")
    return data
