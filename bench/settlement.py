"""The settlement row (issue 28 item 3): posts only, at 1, 8 and 64 concurrent accounts.

Every P3 post credits `settlement:<currency>` in its own transaction. With
PAY_SETTLEMENT_BUCKETS=1 every credit lands in one row, so the posts of one currency queue on
that row's lock, held from the post statement's update until the commit's fsync; with N
buckets a post locks one of N rows (the payout id's). This measures that queue and what the
buckets buy, on a private durable stack (fsync on, synchronous_commit on, pg_stat_statements
loaded) with dlock's real roles, every account in one currency (EUR):

1. Prepare (not measured): per level, fresh accounts and payouts; each is taken through L4
   acquire → P2 claim → the rail submission (RAIL_ACKED) → L6 release, and its grant (token +
   proof) kept for the post.
2. Measure: one client thread per account posts its account's payouts (P3 over HTTP, back to
   back), while a sampler polls paydb's pg_stat_activity every BENCH_SETTLEMENT_SAMPLE_MS (2)
   ms. Row-lock wait share = (mean number of post backends waiting on a heavyweight lock,
   wait_event_type 'Lock') ÷ (mean number of posts in flight, from the clients' latencies:
   Little's law). pg_stat_statements (reset before the window) gives the post statement's and
   COMMIT's mean execution times; the ceiling the row implies is 1 / (statement + commit):
   posts of one currency cannot commit faster than one row-lock hold after another.

   The levels run with PAY_SETTLEMENT_BUCKETS=1 (one row: the contention without buckets).
3. Then the top level again with PAY_SETTLEMENT_BUCKETS=BENCH_SETTLEMENT_BUCKETS (8): the same
   code and workload, payments restarted with the other setting between arms; one bucket and N
   buckets alternate for BENCH_SETTLEMENT_TOP_ROUNDS (2) pairs (before/after, interleaved).
   After every level the settlement balance (its row plus its buckets) must equal its ledger.

Verdict: the gain at the top level is the median over the pairs of (posts/s with N buckets) ÷
(posts/s with one); one row was the limiter when it is at least LIMITER_GAIN (1.2); the
lock-wait shares — of the post's latency, and of the post backends active in PostgreSQL (at
most DB_POOL_MAX: beyond it posts queue for a connection inside payments) — say where the time
goes. Writes `<out>/settlement.json`.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import psycopg

from bench import credentials
from bench.settlement_client import AccountClient
from payments.selectors import account_books

LEVELS = tuple(
    int(v) for v in os.environ.get("BENCH_SETTLEMENT_ACCOUNTS", "1,8,64").split(",") if v
)
POSTS_PER_ACCOUNT = int(os.environ.get("BENCH_SETTLEMENT_POSTS", "0"))  # 0: sized per level
SAMPLE_S = float(os.environ.get("BENCH_SETTLEMENT_SAMPLE_MS", "2")) / 1000
TARGET_POSTS = 320  # per level (at least 4 per account)
# The after arm: PAY_SETTLEMENT_BUCKETS of payments at the top level (the before arm: 1).
BUCKETS = int(os.environ.get("BENCH_SETTLEMENT_BUCKETS", "8"))
TOP_ROUNDS = int(os.environ.get("BENCH_SETTLEMENT_TOP_ROUNDS", "2"))  # (1, BUCKETS) pairs
CURRENCY = "EUR"
LIMITER_GAIN = 1.2  # the buckets must post this much faster for one row to be the limiter
PG_SETTINGS = (
    "shared_preload_libraries=pg_stat_statements",
    "pg_stat_statements.max=2000",
    "track_wal_io_timing=on",  # pg_stat_wal's wal_sync_time: what a commit's flush costs
)
ACTIVE_POSTS = """
SELECT count(*) FILTER (WHERE state = 'active'),
       count(*) FILTER (WHERE state = 'active' AND wait_event_type = 'Lock'),
       count(*) FILTER (WHERE state = 'active' AND wait_event IN ('WALSync', 'WALWrite'))
  FROM pg_stat_activity
 WHERE datname = %s AND backend_type = 'client backend' AND pid <> pg_backend_pid()
"""
# P3's one statement (fenced_sql.POST_SQL: the payout, its event, both legs, the debit and the
# settlement bucket's credit), by its normalised text (constants are $n there).
STATEMENTS = """
SELECT 'post', sum(calls), sum(total_exec_time) / greatest(sum(calls), 1)
  FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
 WHERE d.datname = %s AND query LIKE '%%credited AS%%' AND query LIKE '%%INSERT INTO ledger_entry%%'
"""
# A commit's flush: pg_stat_wal's fsyncs (track_wal_io_timing) over the window.
WAL_SYNC = "SELECT wal_sync, wal_sync_time FROM pg_stat_wal"
# The settlement account's bucket rows the window's credits touched.
BUCKETS_TOUCHED = """
SELECT count(*) FROM settlement_bucket WHERE account_id = %s AND updated_at >= to_timestamp(%s)
"""


def _percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))] if ordered else 0


def _seed(stack, accounts: int, per_account: int) -> list[tuple[str, str, str, int, str]]:
    """`accounts` accounts of CURRENCY with `per_account` PENDING payouts each."""
    result = stack.manage(
        "seed_payouts",
        "--accounts",
        str(accounts),
        "--payouts-per-account",
        str(per_account),
        "--balance-minor",
        str(per_account * 1_000 * 2),
        "--amount-minor",
        "1000",
        "--currency",
        CURRENCY,
        "--json",
    )
    if result.returncode != 0:
        raise RuntimeError(f"seed_payouts failed: {result.stderr[-800:]}")
    data = json.loads(
        next(line for line in reversed(result.stdout.splitlines()) if line.startswith("{"))
    )
    ids = [str(p) for p in data["payouts"]]
    with psycopg.connect(stack.env["PAY_DATABASE_URL"]) as conn:
        rows = conn.execute(
            "SELECT payout_id::text, account_id, idempotency_key, amount_minor, currency"
            " FROM payout WHERE payout_id = ANY(%s::uuid[]) ORDER BY created_at",
            (ids,),
        ).fetchall()
    return [(p, a, k, int(m), c) for p, a, k, m, c in rows]


def _prepare(stack, rows: list) -> tuple[dict[str, AccountClient], dict[str, list]]:
    """Every payout taken to RAIL_ACKED under its account's grant (not measured), 8 threads.
    Every claim advances the account's fence; the posts then present the account's last grant
    (P3 accepts token >= fence), each payout with its own idempotency key."""
    by_account: dict[str, list] = {}
    for row in rows:
        by_account.setdefault(row[1], []).append(row)
    names = sorted(by_account)
    callers = {a: AccountClient(stack, f"settle-{uuid.uuid4().hex[:8]}") for a in names}
    prepared: dict[str, list] = {a: [] for a in names}
    failures: list[str] = []

    def prepare(chunk: list[str]) -> None:
        for account in chunk:
            for payout_id, account_id, key, amount, currency in by_account[account]:
                try:
                    prepared[account].append(
                        callers[account].prepare(payout_id, account_id, key, amount, currency)
                    )
                except Exception as exc:
                    failures.append(f"{type(exc).__name__}: {str(exc)[:160]}")

    threads = [
        threading.Thread(target=prepare, args=(names[i::8],)) for i in range(min(8, len(names)))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(600)
    if failures:
        raise RuntimeError(f"prepare failed ({len(failures)}): {failures[:3]}")
    return callers, prepared


def _post_window(
    callers: dict[str, AccountClient], prepared: dict[str, list], admin_url: str, paydb: str
) -> dict:
    """The measured window: one thread per account posts its payouts back to back while a
    sampler polls pg_stat_activity. Latencies, errors, the samples' sums and the window."""
    names = sorted(callers)
    latencies: list[float] = []
    errors: list[str] = []
    samples = {"n": 0, "active": 0, "lock": 0, "wal": 0}
    stop = threading.Event()
    ready = threading.Barrier(len(names) + 1)

    def sampler() -> None:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            while not stop.is_set():
                active, lock, wal = conn.execute(ACTIVE_POSTS, (paydb,)).fetchone()
                samples["n"] += 1
                samples["active"] += active
                samples["lock"] += lock
                samples["wal"] += wal
                time.sleep(SAMPLE_S)

    def poster(account: str) -> None:
        caller = callers[account]
        latest = prepared[account][-1][1]
        ready.wait()
        for payout_id, fenced, submitted in prepared[account]:
            began = time.monotonic()
            try:
                caller.post(
                    payout_id,
                    {**latest, "X-Idempotency-Key": fenced["X-Idempotency-Key"]},
                    submitted,
                )
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {str(exc)[:160]}")
                continue
            latencies.append(time.monotonic() - began)

    posters = [threading.Thread(target=poster, args=(a,), daemon=True) for a in names]
    for thread in posters:
        thread.start()
    watch = threading.Thread(target=sampler, daemon=True)
    load = round(os.getloadavg()[0], 2)
    ready.wait()
    started, began_at = time.monotonic(), time.time()
    watch.start()
    for thread in posters:
        thread.join(600)
    window = time.monotonic() - started
    stop.set()
    watch.join(10)
    return {
        "latencies": latencies,
        "errors": errors,
        "samples": samples,
        "window": window,
        "began_at": began_at,
        "load": load,
    }


def _books(stack, ids: list[str], began_at: float) -> tuple[int, tuple, int, tuple]:
    """After the window: POSTED rows, (ledger legs, their sum), settlement buckets touched, and
    the settlement account's books."""
    with psycopg.connect(stack.env["PAY_DATABASE_URL"]) as conn:
        posted = conn.execute(
            "SELECT count(*) FROM payout WHERE payout_id = ANY(%s::uuid[]) AND state = 'POSTED'",
            (ids,),
        ).fetchone()[0]
        legs = conn.execute(
            "SELECT count(*), coalesce(sum(CASE direction WHEN 'DEBIT' THEN -amount_minor"
            " ELSE amount_minor END), 0) FROM ledger_entry WHERE payout_id = ANY(%s::uuid[])",
            (ids,),
        ).fetchone()
        settlement = f"settlement:{CURRENCY}"
        touched = conn.execute(BUCKETS_TOUCHED, (settlement, began_at - 1)).fetchone()[0]
        (books,) = account_books(conn.cursor(), account_ids=[settlement])
    return posted, legs, touched, books


def _level(stack, accounts: int, admin_url: str, buckets: int = 1) -> dict:
    """One measured window at `accounts` accounts; payments runs with `buckets` (the caller
    restarted it with PAY_SETTLEMENT_BUCKETS=buckets)."""
    per_account = POSTS_PER_ACCOUNT or max(4, TARGET_POSTS // accounts)
    rows = _seed(stack, accounts, per_account)
    callers, prepared = _prepare(stack, rows)
    paydb = urlsplit(stack.env["PAY_DATABASE_URL"]).path.lstrip("/")
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_statements_reset()")
        wal_before = conn.execute(WAL_SYNC).fetchone()
    run = _post_window(callers, prepared, admin_url, paydb)
    latencies, samples, window = run["latencies"], run["samples"], run["window"]
    with psycopg.connect(admin_url, autocommit=True) as conn:
        stats = {
            kind: (int(calls or 0), float(mean or 0))
            for kind, calls, mean in conn.execute(STATEMENTS, (paydb,)).fetchall()
        }
        wal_after = conn.execute(WAL_SYNC).fetchone()
    syncs = int(wal_after[0] - wal_before[0])
    sync_ms = float(wal_after[1] - wal_before[1]) / syncs if syncs else 0.0
    stats["commit"] = (syncs, sync_ms)
    posted, legs, touched, books = _books(stack, [r[0] for r in rows], run["began_at"])
    for caller in callers.values():
        for conn in caller.conns.values():
            conn.close()
    in_flight = sum(latencies) / window if window else 0.0
    waiting = samples["lock"] / samples["n"] if samples["n"] else 0.0
    in_db = samples["active"] / samples["n"] if samples["n"] else 0.0
    wal = samples["wal"] / samples["n"] if samples["n"] else 0.0
    return {
        "accounts": accounts,
        "buckets": buckets,  # PAY_SETTLEMENT_BUCKETS of payments in this window
        "buckets_touched": int(touched),
        # balance (row + buckets) = ledger sum of the settlement account after the window
        "settlement_books_ok": books[1] == books[2],
        "posts": len(latencies),
        "posted_rows": posted,
        "ledger_legs": int(legs[0]),
        "ledger_sum_minor": int(legs[1]),
        "errors": len(run["errors"]),
        "errors_sample": run["errors"][:3],
        "loadavg_1m_at_start": run["load"],
        "window_s": round(window, 3),
        "posts_per_s": round(len(latencies) / window, 1) if window else None,
        "post_p50_ms": round(_percentile(latencies, 0.5) * 1000, 2),
        "post_p99_ms": round(_percentile(latencies, 0.99) * 1000, 2),
        "posts_in_flight_mean": round(in_flight, 2),
        "lock_waiters_mean": round(waiting, 3),
        "lock_wait_share": round(waiting / in_flight, 3) if in_flight else 0.0,
        # of the post backends active in paydb (at most DB_POOL_MAX: the rest of the posts in
        # flight queue for a connection inside payments), the share waiting on a row lock
        "db_active_mean": round(in_db, 3),
        "lock_wait_share_in_db": round(waiting / in_db, 3) if in_db else 0.0,
        "wal_flush_share": round(wal / in_flight, 3) if in_flight else 0.0,
        "samples": samples["n"],
        "post_statement_ms": round(stats.get("post", (0, 0.0))[1], 3),
        "commit_ms": round(sync_ms, 3),  # mean WAL fsync (pg_stat_wal) in the window
        "statement_calls": {k: v[0] for k, v in stats.items()},  # commit: WAL fsyncs
    }


def with_ceilings(levels: list[dict]) -> list[dict]:
    """The ceiling the row implies at each level: 1 / (the post statement's uncontended time —
    its mean at the fewest accounts, where nobody queues on the row — + that level's commit
    flush). At more accounts the statement's own mean includes the row-lock wait itself."""
    if not levels:
        return levels
    alone = min(levels, key=lambda lvl: (lvl["accounts"], lvl["buckets"]))["post_statement_ms"]
    for level in levels:
        hold = alone + level["commit_ms"]
        level["uncontended_statement_ms"] = alone
        level["ceiling_posts_per_s"] = round(1000 / hold, 1) if hold else None
    return levels


def verdict(levels: list[dict]) -> tuple[bool, float | None, str]:
    """What the buckets buy at the most accounts: the median over the interleaved pairs of
    (posts/s with BUCKETS buckets) ÷ (posts/s with one); one row was the limiter when that is
    at least LIMITER_GAIN. The lock-wait shares say how the time is spent; they do not decide
    (at 64 accounts most posts wait for one of payments' DB_POOL_MAX connections, not in
    PostgreSQL). Returns (limiter, gain, text)."""
    most = max(lvl["accounts"] for lvl in levels)
    single = [lvl for lvl in levels if lvl["accounts"] == most and lvl["buckets"] == 1]
    bucketed = [lvl for lvl in levels if lvl["accounts"] == most and lvl["buckets"] > 1]
    gains = [
        round(b["posts_per_s"] / a["posts_per_s"], 2)
        for a, b in zip(single, bucketed, strict=False)
        if a.get("posts_per_s") and b.get("posts_per_s")
    ]
    gain = round(statistics.median(gains), 2) if gains else None
    top = single[len(single) // 2] if single else max(levels, key=lambda lvl: lvl["accounts"])
    limiter = bool(gain is not None and gain >= LIMITER_GAIN)
    facts = (
        f"{most} accounts, one bucket: {', '.join(str(a['posts_per_s']) for a in single)}"
        f" posts/s, {top['lock_wait_share']:.0%} of post time waiting on a row lock"
        f" ({top.get('lock_wait_share_in_db', 0):.0%} of the post backends in PostgreSQL),"
        f" ceiling 1 / ({top.get('uncontended_statement_ms')} ms statement +"
        f" {top['commit_ms']} ms flush) = {top.get('ceiling_posts_per_s')}/s"
    )
    if bucketed:
        after = bucketed[len(bucketed) // 2]
        facts += (
            f"; {bucketed[0]['buckets']} buckets:"
            f" {', '.join(str(b['posts_per_s']) for b in bucketed)} posts/s,"
            f" {after['lock_wait_share']:.0%} waiting on a row lock"
            f" (gain per pair {gains}, median {gain}×)"
        )
    broken = [lvl for lvl in levels if not lvl.get("settlement_books_ok", True)]
    if broken:
        facts += f"; SETTLEMENT BOOKS BROKEN after {len(broken)} window(s)"
    if limiter:
        return True, gain, f"one settlement row WAS the limiter, the buckets lift it: {facts}"
    return False, gain, f"the buckets do not lift posts by {LIMITER_GAIN}×: {facts}"


def plan(levels: tuple[int, ...]) -> list[tuple[int, int]]:
    """(accounts, buckets) windows in order: every level on one bucket, then the top level on
    BUCKETS, then (1, BUCKETS) pairs until TOP_ROUNDS pairs ran at the top level."""
    windows = [(accounts, 1) for accounts in levels]
    if BUCKETS > 1:
        top = max(levels)
        windows.append((top, BUCKETS))
        for _ in range(TOP_ROUNDS - 1):
            windows += [(top, 1), (top, BUCKETS)]
    return windows


def run(out_dir: str | Path, levels: tuple[int, ...] = LEVELS) -> dict:
    from bench.e2e_pg import setup as _pg_stats_setup
    from experiment.stack import private_stack

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="dlock-bench-settlement-"))
    base.chmod(0o755)
    stack, stop = private_stack(
        base / "stack",
        fast=False,
        extra_env={**credentials.server_env(), "DLOCK_LOG_LEVEL": "WARNING"},
        pg_settings=PG_SETTINGS,
    )
    try:
        _pg_stats_setup(stack)
        admin = stack.pg_cluster.url("postgres")
        rows = []
        running = 8  # payments' default PAY_SETTLEMENT_BUCKETS (not set by private_stack)
        for accounts, buckets in plan(levels):
            if buckets != running:  # the same code; only the setting differs between arms
                stack.restart_role("payments", env={"PAY_SETTLEMENT_BUCKETS": str(buckets)})
                running = buckets
            row = _level(stack, accounts, admin, buckets)
            print(
                f"[bench] settlement {accounts} accounts, {buckets} bucket(s):"
                f" {row['posts_per_s']} posts/s,"
                f" p99 {row['post_p99_ms']} ms, lock wait {row['lock_wait_share']:.0%},"
                f" statement {row['post_statement_ms']} ms, commit flush {row['commit_ms']} ms",
                flush=True,
            )
            rows.append(row)
    finally:
        stop()
        shutil.rmtree(base, ignore_errors=True)
    limiter, gain, text = verdict(with_ceilings(rows))
    data = {
        "name": "settlement",
        "workload": "P3 posts only over HTTP, one client per account, one currency; the levels"
        f" with PAY_SETTLEMENT_BUCKETS=1, the top level also with {BUCKETS}, interleaved;"
        " payouts prepared to RAIL_ACKED beforehand",
        "durability": "fsync=on, synchronous_commit=on",
        "levels": rows,
        "limiter_at_top": limiter,
        "bucket_gain_at_top": gain,
        "verdict": text,
        "lock_wait_share_median": round(statistics.median(r["lock_wait_share"] for r in rows), 3),
        "top_rounds": TOP_ROUNDS,
    }
    (out / "settlement.json").write_text(json.dumps(data, indent=2) + "\n")
    return data
