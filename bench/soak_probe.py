"""What the soak samples: each process's resident memory, open descriptors and threads (from
/proc), the database connections per role (pg_stat_activity), the rows of every table, and the
bytes each log has taken in. One `Probe.sample()` is one row of series, `name -> number`.

Series names: `<role>/<kind>/<measure>` for the server roles (kind: `pod`, the devstack pod
process; `gunicorn-master`; `gunicorn-workers` and `nginx-workers`, summed over the workers,
whose pids a recycle may change; `nginx-master`), `executor-<i>/<measure>` for the executors,
`pg/connections/<application_name>`, `table/<db>/<table>` and `log/<name>` (bytes).
"""

from __future__ import annotations

import os
from pathlib import Path

import psycopg

from bench.proc import descendants

MEASURES = ("rss_kib", "fds", "threads")
CONNECTIONS = """
SELECT coalesce(nullif(application_name, ''), '(none)'), count(*) FROM pg_stat_activity
 WHERE backend_type = 'client backend' AND pid <> pg_backend_pid() GROUP BY 1
"""
TABLE_ROWS = "SELECT relname, n_live_tup FROM pg_stat_user_tables"


def process_stats(pid: int) -> dict[str, int] | None:
    """RSS (KiB), open descriptors and threads of one process; None when it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return {
        "rss_kib": int(fields.get("VmRSS", "0 kB").split()[0]),
        "fds": fds,
        "threads": int(fields.get("Threads", "0").split()[0]),
    }


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except (FileNotFoundError, ProcessLookupError):
        return ""


def _parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return 0


def pod_kind(pid: int, pod: int) -> str:
    """What a process of a role's pod is: the pod itself, nginx's master or a worker, gunicorn's
    master (the pod's child) or one of its workers."""
    if pid == pod:
        return "pod"
    cmd = _cmdline(pid)
    if cmd.startswith("nginx: master"):
        return "nginx-master"
    if cmd.startswith("nginx:"):
        return "nginx-workers"
    return "gunicorn-master" if _parent(pid) == pod else "gunicorn-workers"


def pod_pids(pod: int) -> dict[str, list[int]]:
    """A role's processes by kind (pod_kind)."""
    out: dict[str, list[int]] = {}
    for pid in descendants(pod):
        out.setdefault(pod_kind(pid, pod), []).append(pid)
    return out


def pod_sample(role: str, pod: int) -> dict[str, float]:
    """One role's processes by kind (workers summed), plus how many processes of each kind."""
    out: dict[str, float] = {}
    for pid in descendants(pod):
        stats = process_stats(pid)
        if stats is None:
            continue
        kind = pod_kind(pid, pod)
        for measure, value in stats.items():
            key = f"{role}/{kind}/{measure}"
            out[key] = out.get(key, 0) + value
        out[f"{role}/{kind}/processes"] = out.get(f"{role}/{kind}/processes", 0) + 1
    return out


def log_files(path: Path) -> dict[int, int]:
    """inode -> size of a log and its rotated files (FILE.1 .. FILE.9) as they stand."""
    found: dict[int, int] = {}
    for candidate in [path, *(path.with_name(f"{path.name}.{i}") for i in range(1, 10))]:
        try:
            st = candidate.stat()
        except FileNotFoundError:
            continue
        found[st.st_ino] = st.st_size
    return found


class LogMeter:
    """Bytes a log took in since the start, across rotations: each file is followed by its inode
    (a rotation renames, keeping it), and a file that was dropped keeps the size last seen."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.first = log_files(path)
        self.last = dict(self.first)

    def written(self) -> int:
        self.last.update(log_files(self.path))
        return sum(size - self.first.get(inode, 0) for inode, size in self.last.items())


class Probe:
    """Samples the pods of `pods` (role -> pod pid), the executors of `executors` (a callable
    giving name -> pid now), the cluster at `db_urls` (name -> URL) and the logs of `logs`."""

    def __init__(
        self,
        *,
        pods: dict[str, int],
        executors,
        db_urls: dict[str, str],
        logs: dict[str, Path],
    ) -> None:
        self.pods = pods
        self.executors = executors
        self.db_urls = db_urls
        self.meters = {name: LogMeter(path) for name, path in logs.items()}
        self._conns: dict[str, psycopg.Connection] = {}

    def _query(self, db: str, sql: str) -> list[tuple]:
        """One query on `db`'s sampling connection, reconnecting once (a restart closed it)."""
        for attempt in (1, 2):
            conn = self._conns.get(db)
            try:
                if conn is None or conn.closed:
                    conn = psycopg.connect(
                        self.db_urls[db], autocommit=True, connect_timeout=3,
                        application_name="soak-probe",
                    )  # fmt: skip
                    self._conns[db] = conn
                return conn.execute(sql).fetchall()
            except psycopg.OperationalError:
                self._conns.pop(db, None)
                if attempt == 2:
                    return []
        return []

    def sample(self) -> dict[str, float]:
        row: dict[str, float] = {}
        for role, pod in self.pods.items():
            row.update(pod_sample(role, pod))
        for name, pid in self.executors().items():
            stats = process_stats(pid) or {}
            row.update({f"{name}/{measure}": value for measure, value in stats.items()})
        first_db = next(iter(self.db_urls))
        for app, count in self._query(first_db, CONNECTIONS):
            row[f"pg/connections/{app}"] = count
        for db in self.db_urls:
            for table, rows in self._query(db, TABLE_ROWS):
                row[f"table/{db}/{table}"] = rows
        for name, meter in self.meters.items():
            row[f"log/{name}"] = meter.written()
        return row

    def close(self) -> None:
        for conn in self._conns.values():
            conn.close()
