"""What a server process (gunicorn master + its workers) costs, read from /proc, and a sampler of
every role's CPU over a payout run (`CpuSampler`, used by bench.e2e and bench.payout_floor)."""

from __future__ import annotations

import bisect
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

from experiment.stack import ROLES

SAMPLE_S = 0.05


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


# ----------------------------------------------------------------------------- per-role accounting


def _stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None


def descendants(pid: int) -> list[int]:
    """pid and every process below it (a gunicorn master and its workers; a postmaster and its
    backends), read from /proc/<pid>/task/*/children."""
    found: list[int] = []
    todo = [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        tasks = Path(f"/proc/{current}/task")
        try:
            for task in tasks.iterdir():
                try:
                    todo += [int(p) for p in (task / "children").read_text().split()]
                except (FileNotFoundError, ProcessLookupError):
                    continue
        except (FileNotFoundError, ProcessLookupError):
            continue
    return found


def tree_cpu_seconds(pid: int) -> float:
    """utime+stime of a process tree, plus what its reaped children spent (cutime+cstime of
    every member): a PostgreSQL backend that exits inside a window is still counted."""
    ticks = 0
    for p in descendants(pid):
        fields = _stat(p)
        if fields is None:
            continue
        ticks += sum(int(fields[i]) for i in (11, 12, 13, 14))
    return ticks / os.sysconf("SC_CLK_TCK")


def _listening_inodes(port: int) -> set[str]:
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            cols = line.split()
            if cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(cols[9])
    return inodes


def listener_root(port: int) -> int | None:
    """The topmost process holding the listening socket on `port` (a gunicorn master: its
    workers inherit the socket, so the one whose parent does not hold it)."""
    wanted = {f"socket:[{inode}]" for inode in _listening_inodes(port)}
    if not wanted:
        return None
    holders: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            for fd in (entry / "fd").iterdir():
                if os.readlink(fd) in wanted:
                    holders.add(int(entry.name))
                    break
        except (FileNotFoundError, PermissionError, ProcessLookupError, NotADirectoryError):
            continue
    for pid in holders:
        fields = _stat(pid)
        if fields is not None and int(fields[1]) not in holders:
            return pid
    return None


def role_root(port: int) -> int | None:
    """The process tree that is a role listening on `port`: the listener's root, or, when that
    root runs under a pod supervisor (`python -m devstack.pod`: gunicorn on a unix socket behind
    the role's own nginx, which holds the port), the pod — so a role's CPU is its gunicorn and
    its proxy together, whichever topology the stack runs."""
    root = listener_root(port)
    if root is None:
        return None
    fields = _stat(root)
    if fields is None:
        return root
    parent = int(fields[1])
    try:
        cmdline = Path(f"/proc/{parent}/cmdline").read_bytes().replace(b"\0", b" ")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return root
    return parent if b"devstack.pod" in cmdline else root


# ----------------------------------------------------------------------------- PostgreSQL's split


def _pg_kind(pid: int, root: int, bench_user: str) -> str | None:
    """What a process of a PostgreSQL cluster is, from its title: `backend <db>`, `walwriter`,
    `checkpointer`, `autovacuum worker`, ... (the postmaster itself: `postmaster`)."""
    if pid == root:
        return "postmaster"
    try:
        title = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except (FileNotFoundError, ProcessLookupError):
        return None
    if not title.startswith("postgres:"):
        return None  # just forked: still the postmaster's title; ask again next sample
    title = title.removeprefix("postgres:").strip()
    for kind in (
        "walwriter",
        "checkpointer",
        "background writer",
        "autovacuum launcher",
        "autovacuum worker",
        "logical replication launcher",
        "walsender",
    ):
        if title.startswith(kind):
            return kind
    # A backend: "<user> <database> <client> <state>"; the bench's own polls apart.
    words = title.split()
    if len(words) < 2:
        return "other"
    return f"bench {words[1]}" if words[0] == bench_user else f"backend {words[1]}"


class PgSplit:
    """utime and stime of each process of a PostgreSQL cluster, by kind, sampled; the postmaster's
    reaped children (cutime+cstime: backends and autovacuum workers that exited) are `reaped`."""

    def __init__(self, root: int, *, bench_user: str = "") -> None:
        self.root = root
        self.bench_user = bench_user
        self._kinds: dict[int, str] = {}

    def sample(self) -> dict[int, tuple[str, int, int]]:
        """pid -> (kind, utime ticks, stime ticks); the postmaster's reaped children as pid -1."""
        out: dict[int, tuple[str, int, int]] = {}
        for pid in descendants(self.root):
            fields = _stat(pid)
            if fields is None:
                continue
            kind = self._kinds.get(pid)
            if kind is None:
                kind = _pg_kind(pid, self.root, self.bench_user)
                if kind is None:
                    continue
                self._kinds[pid] = kind
            out[pid] = (kind, int(fields[11]), int(fields[12]))
            if pid == self.root:
                out[-1] = ("reaped", int(fields[13]), int(fields[14]))
        return out

    @staticmethod
    def between(
        first: dict[int, tuple[str, int, int]], last: dict[int, tuple[str, int, int]]
    ) -> dict[str, dict[str, float]]:
        """CPU seconds by kind between two samples, user and system apart; a process that
        started inside counts from zero, one that exited is in `reaped`."""
        tick = os.sysconf("SC_CLK_TCK")
        out: dict[str, dict[str, float]] = {}
        for pid, (kind, utime, stime) in last.items():
            _, u0, s0 = first.get(pid, (kind, 0, 0))
            row = out.setdefault(kind, {"user": 0.0, "system": 0.0})
            row["user"] += (utime - u0) / tick
            row["system"] += (stime - s0) / tick
        return out


def py_spy_recorders(pids: dict[str, int], profile_dir: Path | None) -> list[subprocess.Popen]:
    if profile_dir is None:
        return []
    profile_dir.mkdir(parents=True, exist_ok=True)
    py_spy = Path(sys.executable).with_name("py-spy")
    return [
        subprocess.Popen(
            [
                str(py_spy),
                "record",
                "--pid",
                str(pid),
                "--subprocesses",
                "--nonblocking",
                "--gil",
                "--format",
                "raw",
                "--rate",
                "200",
                "-o",
                str(profile_dir / f"{role}.txt"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for role, pid in pids.items()
        if role != "postgres"
    ]


def proc_status_kib(pid: int, field: str) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


STATES = "SELECT state, count(*) FROM payout WHERE payout_id = ANY(%s::uuid[]) GROUP BY state"


def role_pids(stack) -> dict[str, int]:
    """The root process of every server role (by listening port; its pod when the role runs
    behind its own proxy, so the proxy's CPU is the role's too) and the postmaster."""
    pids: dict[str, int] = {}
    for role in ROLES:
        port = urlsplit(stack.url(role)).port
        pid = role_root(port) if port else None
        if pid is None:
            raise RuntimeError(f"no process listens on {stack.url(role)} ({role})")
        pids[role] = pid
    postmaster = Path(stack.pg_cluster.datadir) / "postmaster.pid"
    pids["postgres"] = int(postmaster.read_text().split()[0])
    return pids


class CpuSampler:
    """(wall time, CPU seconds per role) every SAMPLE_S, from /proc, in a thread."""

    def __init__(self, pids: dict[str, int], *, pg_split_user: str | None = None) -> None:
        self.pids = pids
        self.times: list[float] = []
        self.samples: list[dict[str, float]] = []
        # PostgreSQL's processes by kind, user and system apart (the bench's own polls, as
        # `pg_split_user`, apart too), when given.
        self._split = PgSplit(pids["postgres"], bench_user=pg_split_user) if pg_split_user else None
        self.pg_samples: list[dict] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _take(self) -> None:
        row = {role: tree_cpu_seconds(pid) for role, pid in self.pids.items()}
        if self._split is not None:
            self.pg_samples.append(self._split.sample())
        self.times.append(time.time())
        self.samples.append(row)

    def pg_between(self, first: float, last: float, *, payouts: int) -> dict:
        """PostgreSQL's CPU ms per payout by process kind (user / system) between two wall
        times (the nearest samples inside the window)."""
        i = min(bisect.bisect_left(self.times, first), len(self.times) - 1)
        j = max(bisect.bisect_right(self.times, last) - 1, i)
        split = PgSplit.between(self.pg_samples[i], self.pg_samples[j])
        span = max(self.times[j] - self.times[i], 1e-9)
        # Samples nearest the window, not interpolated: scale to the window's payouts.
        scale = 1000 * ((last - first) / span) / max(payouts, 1)
        out = {
            kind: {k: round(v * scale, 3) for k, v in row.items()}
            for kind, row in sorted(split.items())
        }
        out["total"] = {
            k: round(sum(row[k] for row in split.values()) * scale, 3) for k in ("user", "system")
        }
        return out

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._take()
            self._stop.wait(SAMPLE_S)

    def __enter__(self) -> CpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._take()

    def at(self, when: float) -> dict[str, float]:
        """CPU per role at wall time `when`, linearly interpolated between samples."""
        i = bisect.bisect_left(self.times, when)
        if i <= 0:
            return dict(self.samples[0])
        if i >= len(self.times):
            return dict(self.samples[-1])
        t0, t1 = self.times[i - 1], self.times[i]
        f = (when - t0) / (t1 - t0) if t1 > t0 else 0.0
        a, b = self.samples[i - 1], self.samples[i]
        return {role: a[role] + f * (b[role] - a[role]) for role in a}
