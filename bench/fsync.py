"""The disk's fsync floor (`pg_test_fsync -s 1`): every durable number in the bench sits on it.

A durable commit is at least one WAL flush, so fdatasync ops/s bounds commits/s for one
session (group commit lets concurrent sessions share a flush).
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

from devstack.postgres import pg_bindir

LINE = re.compile(
    r"^\s*(?P<method>[a-z_]+(?: [a-z_]+)*)\*?\s+(?P<ops>[0-9.]+) ops/sec\s+(?P<us>[0-9]+) usecs/op"
)


def run(out_dir: Path, *, seconds: int = 1) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    binary = pg_bindir() / "pg_test_fsync"
    scratch = out_dir / "pg_test_fsync.tmp"
    started = time.time()
    result = subprocess.run(
        [str(binary), "-s", str(seconds), "-f", str(scratch)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    scratch.unlink(missing_ok=True)
    section = ""
    methods: dict[str, dict[str, float]] = {}
    for line in result.stdout.splitlines():
        if line.startswith("Compare") or line.startswith("Non-sync"):
            section = line.strip().rstrip(":")
        match = LINE.match(line)
        if match and section.startswith("Compare file sync methods using one 8kB write"):
            methods[match["method"].strip()] = {
                "ops_per_s": float(match["ops"]),
                "usecs_per_op": int(match["us"]),
            }
    floor = methods.get("fdatasync") or next(iter(methods.values()), None)
    data = {
        "name": "fsync",
        "tool": str(binary),
        "scratch_dir": str(out_dir.resolve()),
        "seconds_per_test": seconds,
        "exit_code": result.returncode,
        "one_8k_write": methods,
        "fdatasync_ops_per_s": floor["ops_per_s"] if floor else None,
        "fdatasync_usecs_per_op": floor["usecs_per_op"] if floor else None,
        "elapsed_s": round(time.time() - started, 1),
        "raw": result.stdout[-4000:] + result.stderr[-1000:],
    }
    (out_dir / "fsync.json").write_text(json.dumps(data, indent=2))
    summary = [  # docs/performance.md's machine table quotes both
        {
            "label": f"disk (pg_test_fsync, one 8 kB write + {method})",
            "value": methods[method]["ops_per_s"],
            "unit": "flushes/s",
            "detail": f"{methods[method]['usecs_per_op']} µs per flush",
        }
        for method in ("fdatasync", "fsync")
        if method in methods
    ]
    return {**data, "summary": summary}
