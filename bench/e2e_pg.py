"""PostgreSQL's side of an e2e point (BENCH_E2E_PG_STATS=1): statements, transactions, WAL,
connections and row writes per posted payout, by database; the bench's own polls run as another
user so pg_stat_statements can leave them out."""

from __future__ import annotations

import os
import time
from urllib.parse import urlsplit

import psycopg

# BENCH_E2E_PG_STATS=1: the cluster preloads pg_stat_statements, and each point reports the
# statements (calls, execution ms, WAL bytes) and transactions per payout by database (the bench's
# own polls under another user), pg_stat_wal, connections opened, row writes and HOT updates per
# table, and PostgreSQL's CPU per payout by process kind, user and system apart (bench.proc).
PG_STATS = os.environ.get("BENCH_E2E_PG_STATS", "") not in ("", "0")
PG_STATS_SETTINGS = ("shared_preload_libraries=pg_stat_statements", "pg_stat_statements.max=2000")
# BENCH_E2E_PG_SETTINGS="commit_delay=100 commit_siblings=5": more settings for the bench's
# cluster (measuring a recommended setting); durability settings are refused.
PG_EXTRA_SETTINGS = tuple(os.environ.get("BENCH_E2E_PG_SETTINGS", "").split())
if any(
    s.split("=")[0] in ("fsync", "synchronous_commit", "full_page_writes")
    for s in PG_EXTRA_SETTINGS
):
    raise SystemExit(
        "BENCH_E2E_PG_SETTINGS must not change fsync, synchronous_commit or full_page_writes"
    )
BENCH_USER = "dlock_bench"
XACTS = "SELECT datname, xact_commit + xact_rollback FROM pg_stat_database WHERE datname <> ''"
SESSIONS = "SELECT datname, sessions FROM pg_stat_database WHERE datname <> ''"
STATEMENTS = """
SELECT d.datname, s.calls, s.query, s.total_exec_time, s.wal_bytes
  FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
 WHERE s.userid <> (SELECT oid FROM pg_roles WHERE rolname = %s)
"""
WAL = "SELECT wal_records, wal_fpi, wal_bytes, wal_write, wal_sync FROM pg_stat_wal"


def as_bench_user(url: str) -> str:
    """The same database as the bench's own user, so pg_stat_statements can leave it out."""
    parts = urlsplit(url)
    return parts._replace(netloc=f"{BENCH_USER}@{parts.hostname}:{parts.port}").geturl()


def setup(stack) -> None:
    admin = stack.pg_cluster.url("postgres")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        if not conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (BENCH_USER,)).fetchone():
            conn.execute(f"CREATE ROLE {BENCH_USER} LOGIN SUPERUSER")


TABLES = """
SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del FROM pg_stat_user_tables
"""


def _table_stats(stack) -> dict[str, tuple[int, int, int, int]]:
    """Rows inserted / updated / HOT-updated / deleted so far, by `db.table`."""
    out: dict[str, tuple[int, int, int, int]] = {}
    for db in ("lockdb", "paydb", "raildb"):
        with psycopg.connect(stack.pg_cluster.url(db), autocommit=True) as conn:
            for name, *counts in conn.execute(TABLES).fetchall():
                out[f"{db}.{name}"] = tuple(counts)
    return out


def begin(stack) -> dict[str, int]:
    with psycopg.connect(stack.pg_cluster.url("postgres"), autocommit=True) as conn:
        conn.execute("SELECT pg_stat_statements_reset()")
        conn.execute("SELECT pg_stat_reset_shared('wal')")
        conn.execute("SELECT pg_stat_clear_snapshot()")
        sessions = {f"sessions {db}": n for db, n in conn.execute(SESSIONS).fetchall()}
        xacts = dict(conn.execute(XACTS).fetchall())
    tables = {f"table {name}": counts for name, counts in _table_stats(stack).items()}
    return {**xacts, **sessions, **tables}


def end(stack, xacts_before: dict[str, int], *, posted: int, polls: int) -> dict:
    """Statements (by text, top ones) and transactions per posted payout, by database."""
    time.sleep(0.6)  # the cumulative statistics are flushed at most once a second
    with psycopg.connect(stack.pg_cluster.url("postgres"), autocommit=True) as conn:
        xacts = dict(conn.execute(XACTS).fetchall())
        rows = conn.execute(STATEMENTS, (BENCH_USER,)).fetchall()
        wal = conn.execute(WAL).fetchone()
        sessions = dict(conn.execute(SESSIONS).fetchall())
    per = max(posted, 1)
    out: dict[str, dict] = {}
    for db in ("lockdb", "paydb", "raildb"):
        # (calls, execution ms, WAL bytes, text) per payout, most called first.
        mine = sorted(((c, ms, w, q) for d, c, q, ms, w in rows if d == db), reverse=True)
        done = xacts.get(db, 0) - xacts_before.get(db, 0) - (polls if db == "paydb" else 0)
        out[db] = {
            "statements": round(sum(r[0] for r in mine) / per, 2),
            "transactions": round(done / per, 2),
            "exec_ms": round(sum(r[1] for r in mine) / per, 3),
            # Connections opened (the bench's own polls included), per payout.
            "sessions": round(
                (sessions.get(db, 0) - xacts_before.get(f"sessions {db}", 0)) / per, 3
            ),
            "wal_bytes": round(sum(int(r[2]) for r in mine) / per),
            "top": [
                [
                    round(c / per, 2),
                    round(ms / per, 4),
                    round(int(w) / per),
                    " ".join(q.split())[:160],
                ]
                for c, ms, w, q in mine[:25]
            ],
        }
    # Row writes per payout by table; `hot`: updates that stayed on the page with no index entry.
    tables = {}
    for name, after in _table_stats(stack).items():
        before = xacts_before.get(f"table {name}", (0, 0, 0, 0))
        diff = [round((a - b) / per, 2) for a, b in zip(after, before, strict=True)]
        if any(diff):
            tables[name] = dict(zip(("ins", "upd", "hot", "del"), diff, strict=True))
    out["rows_per_payout"] = tables
    out["wal_per_payout"] = dict(
        zip(
            ("records", "full_page_images", "bytes", "writes", "syncs"),
            (round(float(v) / per, 2) for v in wal),
            strict=True,
        )
    )
    return out
