"""Payment resource: claim+post pairs per second at 1/8/32 clients, over HTTP and as the same
SQL issued directly with psycopg, in the same run, with the ratio.

Starts its own durable PostgreSQL cluster (fsync on) and the payments role under gunicorn
(production settings: one worker, its default threads and DB pool). Every client owns one
account (no cross-client fencing: this measures the path, not contention) and loops over its
own pre-placed PENDING payouts: claim (token t) → move the payout to RAIL_ACKED directly in SQL
(the rail is not part of this measure; that UPDATE runs with synchronous_commit=off and is not
in the pair latency) → post (token t). The direct arm runs `payments.services.claim_steps` /
`post_steps` — the exact statements the service runs — on a psycopg connection per client,
one transaction each, without Django's request stack or HTTP.

Writes `<out_dir>/payments.json` and returns the same dict. `python -m bench.payments [out]`.
"""

from __future__ import annotations

import json
import os
import secrets
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import psycopg
import requests

from bench import credentials
from devstack import PgCluster, RoleProcess, free_port, manage
from dlock import proof

DURATION_S = float(os.environ.get("BENCH_PAYMENTS_SECONDS", "5"))
WARMUP_S = 0.5
# Payouts placed per level and arm, split over its clients; a client that runs out simply stops
# (reported as clients_out_of_payouts, so a too-small budget can't hide).
LEVEL_BUDGET = int(os.environ.get("BENCH_PAYMENTS_PER_LEVEL", "20000"))

ACK_SQL = "UPDATE payout SET state = 'RAIL_ACKED' WHERE payout_id = %s AND state = 'CLAIMED'"

PLACE_ACCOUNT_SQL = """
INSERT INTO account (account_id, currency, kind, balance_minor, fence, updated_at)
VALUES (%(account)s, 'EUR', 'CUSTOMER', %(balance)s, 0, clock_timestamp()),
       ('funding:EUR', 'EUR', 'FUNDING', 0, 0, clock_timestamp())
ON CONFLICT (account_id) DO NOTHING
"""
OPENING_SQL = """
WITH f AS (UPDATE account SET balance_minor = balance_minor - %(balance)s
            WHERE account_id = 'funding:EUR')
INSERT INTO ledger_entry (entry_id, payout_id, account_id, direction, amount_minor, fence,
                          posted_at)
VALUES (gen_random_uuid(), NULL, %(account)s, 'CREDIT', %(balance)s, 0, clock_timestamp()),
       (gen_random_uuid(), NULL, 'funding:EUR', 'DEBIT', %(balance)s, 0, clock_timestamp())
"""
PLACE_PAYOUTS_SQL = """
WITH ids AS (SELECT gen_random_uuid() AS id, n FROM generate_series(1, %(count)s) n)
INSERT INTO payout (payout_id, account_id, amount_minor, currency, beneficiary_ref, state,
                    attempt_count, idempotency_key, created_at, updated_at)
SELECT id, %(account)s, 1, 'EUR', 'bench', 'PENDING', 0, 'payout-' || id,
       clock_timestamp(), clock_timestamp()
  FROM ids ORDER BY n
RETURNING payout_id
"""


def _percentile(samples: list[float], q: float) -> float:
    if not samples:
        return 0.0
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def _place(db_url: str, clients: int, tag: str) -> list[tuple[str, list[uuid.UUID]]]:
    """One account per client with a huge balance, and its PENDING payouts."""
    placed = []
    with psycopg.connect(db_url, autocommit=True) as conn:
        for i in range(clients):
            account = f"bench-{tag}-{i}-{uuid.uuid4().hex[:8]}"
            count = max(300, LEVEL_BUDGET // clients)
            params = {"account": account, "balance": 10**15, "count": count}
            with conn.transaction():
                conn.execute(PLACE_ACCOUNT_SQL, params)
                conn.execute(OPENING_SQL, params)
                ids = [r[0] for r in conn.execute(PLACE_PAYOUTS_SQL, params).fetchall()]
            placed.append((account, ids))
    return placed


class _Exhausted(Exception):
    pass


def _drive(clients: int, make_pair: Callable[[int], Callable[[], None]], seconds: float) -> dict:
    """`clients` threads loop on their pair function; pairs/s over the measured window."""
    latencies: list[list[float]] = [[] for _ in range(clients)]
    errors = [0] * clients
    exhausted = [False] * clients
    start = threading.Barrier(clients + 1)
    window = [0.0, 0.0]

    def worker(index: int) -> None:
        pair = make_pair(index)
        start.wait()
        try:
            while time.monotonic() < window[0]:
                pair()  # warm-up
            while time.monotonic() < window[1]:
                try:
                    latencies[index].append(pair())
                except _Exhausted:
                    raise
                except Exception:
                    errors[index] += 1
        except _Exhausted:
            exhausted[index] = True

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(clients)]
    for thread in threads:
        thread.start()
    now = time.monotonic()
    window[0], window[1] = now + WARMUP_S, now + WARMUP_S + seconds
    start.wait()
    for thread in threads:
        thread.join(WARMUP_S + seconds + 60)
    flat = [x for per in latencies for x in per]
    return {
        "pairs": len(flat),
        "errors": sum(errors),
        "clients_out_of_payouts": sum(exhausted),
        "pairs_per_s": round(len(flat) / seconds, 1),
        "p50_ms": round(_percentile(flat, 0.50) * 1000, 2),
        "p99_ms": round(_percentile(flat, 0.99) * 1000, 2),
        "mean_ms": round(statistics.fmean(flat) * 1000, 2) if flat else 0.0,
    }


def _payout_feed(ids: list[uuid.UUID]) -> Callable[[], uuid.UUID]:
    it = iter(ids)

    def take() -> uuid.UUID:
        try:
            return next(it)
        except StopIteration:
            raise _Exhausted from None

    return take


def _http_pairs(base: str, db_url: str, placed) -> Callable[[int], Callable[[], float]]:
    def make(index: int) -> Callable[[], float]:
        http = requests.Session()
        ack = psycopg.connect(db_url, autocommit=True)
        ack.execute("SET synchronous_commit = off")
        account, ids = placed[index]
        take = _payout_feed(ids)
        tokens = iter(range(1, 10**12))
        owner = f"bench-http-{index}"
        # Stands in for the lock server: the proof L4 would have answered for this token.
        ring = proof.parse_key_ring(os.environ["DLOCK_PROOF_KEYS"])

        def pair() -> float:
            payout_id, token = take(), next(tokens)
            headers = {
                **credentials.headers(),
                "X-Fencing-Token": str(token),
                "X-Fencing-Proof": proof.sign(
                    key=proof.payout_key(account), token=token, ring=ring
                ),
                "X-Owner-Id": owner,
                "X-Idempotency-Key": f"payout-{payout_id}",
            }
            began = time.monotonic()
            claimed = http.post(
                f"{base}/v1/payouts/{payout_id}/claim",
                json={"expectedState": "PENDING"},
                headers=headers,
                timeout=10,
            )
            spent = time.monotonic() - began
            if claimed.status_code != 200:
                raise RuntimeError(f"claim answered {claimed.status_code}: {claimed.text[:200]}")
            ack.execute(ACK_SQL, (payout_id,))
            began = time.monotonic()
            posted = http.post(
                f"{base}/v1/payouts/{payout_id}/post",
                json={"railReference": f"rr-{token}", "submissionId": str(uuid.uuid4())},
                headers=headers,
                timeout=10,
            )
            spent += time.monotonic() - began
            if posted.status_code != 200:
                raise RuntimeError(f"post answered {posted.status_code}: {posted.text[:200]}")
            return spent

        return pair

    return make


def _direct_pairs(db_url: str, placed) -> Callable[[int], Callable[[], float]]:
    from payments import services

    def make(index: int) -> Callable[[], float]:
        conn = psycopg.connect(db_url)
        ack = psycopg.connect(db_url, autocommit=True)
        ack.execute("SET synchronous_commit = off")
        _, ids = placed[index]
        take = _payout_feed(ids)
        tokens = iter(range(1, 10**12))
        owner = f"bench-sql-{index}"

        def pair() -> float:
            payout_id, token = take(), next(tokens)
            key = f"payout-{payout_id}"
            began = time.monotonic()
            with conn.transaction(), conn.cursor() as cur:
                result, failure = services.claim_steps(
                    cur,
                    payout_id=payout_id,
                    token=token,
                    owner_id=owner,
                    idempotency_key=key,
                    expected_state="PENDING",
                )
            spent = time.monotonic() - began
            if failure is not None or result.status != 200:
                raise RuntimeError(f"claim answered {result.status}")
            ack.execute(ACK_SQL, (payout_id,))
            began = time.monotonic()
            with conn.transaction(), conn.cursor() as cur:
                services.post_steps(
                    cur,
                    payout_id=payout_id,
                    token=token,
                    owner_id=owner,
                    idempotency_key=key,
                    rail_reference=f"rr-{token}",
                    submission_id=uuid.uuid4(),
                )
            return spent + (time.monotonic() - began)

        return pair

    return make


def run(
    out_dir: str | Path,
    clients: tuple[int, ...] = (1, 8, 32),
    *,
    seconds: float = DURATION_S,
) -> dict:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="dlock-bench-payments-"))
    work.chmod(0o755)
    cluster = PgCluster(work / "pg", free_port())  # durable: fsync on
    server: RoleProcess | None = None
    try:
        cluster.start()
        db_url = cluster.create_database("bench_paydb")
        env = {
            "DJANGO_SECRET_KEY": os.environ.get("DJANGO_SECRET_KEY") or secrets.token_urlsafe(48),
            "DJANGO_DEBUG": "false",
            "PAY_DATABASE_URL": db_url,
            "DLOCK_LOG_LEVEL": "WARNING",
            **credentials.server_env(),  # issue 15 credentials, decision 15 proof keys
        }
        manage(["migrate", "--no-input", "-v", "0"], env, role="payments")
        server = RoleProcess("payments", free_port(), env, work / "payments.log").start()

        # The direct arm imports payments.services (Django models): configure Django once.
        for name, value in {
            **env,
            "LOCK_DATABASE_URL": db_url,
            "RAIL_DATABASE_URL": db_url,
            "DJANGO_SETTINGS_MODULE": "settings.ops",
        }.items():
            os.environ.setdefault(name, value)
        import django

        django.setup()

        load_before = os.getloadavg()
        levels = []
        for n in clients:
            http_row = _drive(n, _http_pairs(server.url, db_url, _place(db_url, n, "h")), seconds)
            sql_row = _drive(n, _direct_pairs(db_url, _place(db_url, n, "d")), seconds)
            levels.append(
                {
                    "clients": n,
                    "http": http_row,
                    "direct": sql_row,
                    "http_over_direct": round(http_row["pairs_per_s"] / sql_row["pairs_per_s"], 3)
                    if sql_row["pairs_per_s"]
                    else None,
                }
            )
        with psycopg.connect(db_url) as conn:
            server_version = conn.execute("SHOW server_version").fetchone()[0]
            fsync = conn.execute("SHOW fsync").fetchone()[0]
        result = {
            "name": "payments",
            "what": "claim+post pairs per second (P2 then P3 on one payout, one token)",
            "seconds_per_level": seconds,
            "postgres": server_version,
            "fsync": fsync,
            "gunicorn": {
                "workers": os.environ.get("GUNICORN_WORKERS", "1"),
                "threads": os.environ.get("GUNICORN_THREADS", "16"),
                "db_pool_max": os.environ.get("DB_POOL_MAX", "8"),
            },
            "cpus": os.cpu_count(),
            # A shared, busy machine skews every number; the load average says how busy.
            "loadavg_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
            "levels": levels,
        }
        (out / "payments.json").write_text(json.dumps(result, indent=2) + "\n")
        return result
    finally:
        if server is not None:
            server.stop()
        cluster.stop()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    out_dir = args[0] if args else ".run/bench"
    result = run(out_dir)
    print(f"{'clients':>7} {'http pairs/s':>13} {'direct pairs/s':>15} {'ratio':>6}")
    for row in result["levels"]:
        print(
            f"{row['clients']:>7} {row['http']['pairs_per_s']:>13} "
            f"{row['direct']['pairs_per_s']:>15} {row['http_over_direct']!s:>6}"
        )
    print(f"written to {Path(out_dir) / 'payments.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
