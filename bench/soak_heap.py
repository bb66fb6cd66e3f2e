"""`python -m bench.soak --tracemalloc`: where the memory that grew after warm-up was allocated.

Every Python process of the run starts with bench/soak_tracemalloc/ on its PYTHONPATH, so its
sitecustomize traces allocations and writes a snapshot on a signal. The soak signals each
gunicorn worker and each executor at the end of warm-up and at the end of the load; the
allocations that grew between the two, by traceback, are the evidence for a leak's cause.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import tracemalloc
from pathlib import Path

from bench.soak_probe import pod_pids
from devstack.common import PROJECT

SITE = PROJECT / "bench" / "soak_tracemalloc"
# the same as bench/soak_tracemalloc/sitecustomize.py's (that file is no module of a package)
SNAPSHOT_SIGNAL = signal.SIGRTMIN + 3
TOP = 6


def traced_env(directory: Path) -> dict[str, str]:
    """What a traced process's environment adds."""
    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.glob("*.snap*"):
        old.unlink()
    return {"PYTHONPATH": str(SITE), "DLOCK_SOAK_TRACEMALLOC_DIR": str(directory)}


class HeapWatch:
    """Which processes are snapshotted (gunicorn workers of every pod, executors) and when."""

    def __init__(self, directory: Path, pods: dict[str, int], executors) -> None:
        self.directory = directory
        self.pods = pods
        self.executors = executors
        self.pids: dict[str, int] = {}
        self.taken = 0

    def snapshot(self) -> None:
        if not self.pids:
            for role, pod in self.pods.items():
                for i, pid in enumerate(pod_pids(pod).get("gunicorn-workers", [])):
                    self.pids[f"{role}/gunicorn-worker-{i}"] = pid
            self.pids |= self.executors()
        for pid in self.pids.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, SNAPSHOT_SIGNAL)
        self.taken += 1

    def _load(self, pid: int, n: int, deadline: float) -> tracemalloc.Snapshot | None:
        path = self.directory / f"{pid}-{n}.snap"
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.5)
        return tracemalloc.Snapshot.load(str(path)) if path.exists() else None

    def grown(self, wait_s: float = 60.0) -> dict[str, list[dict]]:
        """Per process: the tracebacks whose allocations grew most between the two snapshots."""
        deadline = time.monotonic() + wait_s
        out: dict[str, list[dict]] = {}
        for name, pid in self.pids.items():
            first, last = self._load(pid, 1, deadline), self._load(pid, 2, deadline)
            if first is None or last is None:
                out[name] = [{"missing": f"snapshots of pid {pid}"}]
                continue
            stats = last.compare_to(first, "traceback")
            out[name] = [
                {
                    "size_diff_kib": round(stat.size_diff / 1024, 1),
                    "count_diff": stat.count_diff,
                    "traceback": [
                        f"{f.filename.removeprefix(str(PROJECT) + '/')}:{f.lineno}"
                        for f in stat.traceback
                    ],
                }  # fmt: skip
                for stat in stats[:TOP]
            ]
        return out
