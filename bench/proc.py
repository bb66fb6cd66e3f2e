"""What a server process (gunicorn master + its workers) costs, read from /proc."""

from __future__ import annotations

import os
from pathlib import Path


def _tree(pid: int) -> list[int]:
    children = Path(f"/proc/{pid}/task/{pid}/children")
    return [pid] + ([int(p) for p in children.read_text().split()] if children.exists() else [])


def rss_kib(pid: int) -> int:
    """Resident memory of a process and its children."""
    total = 0
    for p in _tree(pid):
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except FileNotFoundError:
            continue
    return total


def cpu_seconds(pid: int) -> float:
    """User+system CPU of a process and its children."""
    ticks = 0
    for p in _tree(pid):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")
