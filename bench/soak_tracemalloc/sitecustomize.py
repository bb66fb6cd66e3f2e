"""Loaded at start-up by every Python process of a `python -m bench.soak --tracemalloc` run (this
directory is on their PYTHONPATH; never in a role's own environment): traces allocations, and on
SNAPSHOT_SIGNAL writes a tracemalloc snapshot to $DLOCK_SOAK_TRACEMALLOC_DIR/<pid>-<n>.snap,
which the soak compares between the end of warm-up and the end of the load."""

from __future__ import annotations

import itertools
import os
import signal
import tracemalloc

SNAPSHOT_SIGNAL = signal.SIGRTMIN + 3
_DIR = os.environ.get("DLOCK_SOAK_TRACEMALLOC_DIR")
_COUNT = itertools.count(1)


def _dump(_signum: int, _frame: object) -> None:
    assert _DIR is not None
    path = os.path.join(_DIR, f"{os.getpid()}-{next(_COUNT)}.snap")
    snapshot = tracemalloc.take_snapshot().filter_traces(
        [tracemalloc.Filter(False, tracemalloc.__file__)]
    )
    snapshot.dump(path + ".part")
    os.replace(path + ".part", path)


if _DIR:
    tracemalloc.start(int(os.environ.get("DLOCK_SOAK_TRACEMALLOC_FRAMES", "6")))
    signal.signal(SNAPSHOT_SIGNAL, _dump)
