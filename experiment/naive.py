"""The naive control arm: a lease-only lock, no fencing tokens, workers calling the rail directly.

This is the design dlock exists to replace, written the way it is usually written: a lease row in
PostgreSQL (acquired when expired, released by owner), a local "is my lease still valid?" check
before every write, the same payout state machine as the real system (claim, submit, post;
a rail timeout quarantines the payout), and recovery of a CLAIMED payout by the next lease holder
because "its lease expired, so its worker is dead". Nothing downstream checks a token, so a worker
that was paused (or whose rail call outlived its lease) still presents its payment.

It lives here, in experiment code, on purpose (ARCHITECTURE §11): no service gets a "fencing off"
switch. Tables are private to the experiment (`experiment_naive_*` in paydb, created on demand,
keyed by run id). The worker is a plain process (`python -m experiment.naive ...`) without Django
so it starts fast and can be SIGSTOPped, killed and restarted like the real executor.

Phase pause hook: the executor's own (`executor.pause`, `DLOCK_EXECUTOR_PAUSE_AT=<phase>:stop`),
at the same three points of the critical section — right after the local "is my lease still
valid?" check and before the write it guards (`before_claim`, `before_submit`, `before_post`).
The worker SIGSTOPs itself there and logs `executor_paused`; the orchestrator sees the stopped
process and SIGCONTs it after the scheduled pause. One hook, one spelling, for both arms.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
import uuid

import psycopg
import requests

from dlock.logs import JsonFormatter, log_event
from executor.pause import PausePlan

# The experiment's names for the phases of a critical section (the schedule's vocabulary).
PHASES = ("locked", "claimed", "submitted", "posted")

DDL = """
CREATE TABLE IF NOT EXISTS experiment_naive_account (
    account_id text PRIMARY KEY,
    run_id text NOT NULL,
    currency char(3) NOT NULL,
    balance_minor bigint NOT NULL
);
CREATE TABLE IF NOT EXISTS experiment_naive_payout (
    payout_id uuid PRIMARY KEY,
    run_id text NOT NULL,
    account_id text NOT NULL,
    amount_minor bigint NOT NULL CHECK (amount_minor > 0),
    currency char(3) NOT NULL,
    state text NOT NULL,
    owner_id text,
    rail_reference text,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS experiment_naive_payout_run_state
    ON experiment_naive_payout (run_id, state);
CREATE TABLE IF NOT EXISTS experiment_naive_lease (
    lease_key text PRIMARY KEY,
    owner_id text NOT NULL,
    expires_at timestamptz NOT NULL
);
CREATE TABLE IF NOT EXISTS experiment_naive_attempt (
    attempt_id bigserial PRIMARY KEY,
    run_id text NOT NULL,
    payout_id uuid NOT NULL,
    owner_id text NOT NULL,
    outcome text,
    rail_reference text,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS experiment_naive_attempt_run ON experiment_naive_attempt (run_id);
CREATE TABLE IF NOT EXISTS experiment_naive_ledger (
    entry_id bigserial PRIMARY KEY,
    run_id text NOT NULL,
    payout_id uuid,
    account_id text NOT NULL,
    direction text NOT NULL,
    amount_minor bigint NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS experiment_naive_ledger_run ON experiment_naive_ledger (run_id);
"""

# The lease: take the row when it is absent or expired (the database clock decides expiry).
ACQUIRE_LEASE = """
INSERT INTO experiment_naive_lease (lease_key, owner_id, expires_at)
VALUES (%(key)s, %(owner)s, clock_timestamp() + %(ttl)s * interval '1 millisecond')
ON CONFLICT (lease_key) DO UPDATE
   SET owner_id = EXCLUDED.owner_id, expires_at = EXCLUDED.expires_at
 WHERE experiment_naive_lease.expires_at < clock_timestamp()
RETURNING owner_id
"""
RELEASE_LEASE = (
    "DELETE FROM experiment_naive_lease WHERE lease_key = %(key)s AND owner_id = %(owner)s"
)

# Accounts with work whose lease is free (advisory: the lease insert decides).
ACCOUNTS_WITH_WORK = """
SELECT DISTINCT p.account_id
  FROM experiment_naive_payout p
  LEFT JOIN experiment_naive_lease l
         ON l.lease_key = 'naive:' || p.run_id || ':' || p.account_id
        AND l.expires_at >= clock_timestamp()
 WHERE p.run_id = %(run)s AND p.state IN ('PENDING', 'CLAIMED') AND l.lease_key IS NULL
"""
NEXT_PAYOUT = """
SELECT payout_id, amount_minor, currency, state
  FROM experiment_naive_payout
 WHERE run_id = %(run)s AND account_id = %(account)s AND state IN ('PENDING', 'CLAIMED')
 ORDER BY created_at, payout_id
 LIMIT 1
"""
# Naive recovery: a CLAIMED payout under a free lease "belongs to a dead worker" and is re-claimed.
CLAIM = """
UPDATE experiment_naive_payout
   SET state = 'CLAIMED', owner_id = %(owner)s, updated_at = clock_timestamp()
 WHERE payout_id = %(payout)s AND state IN ('PENDING', 'CLAIMED')
"""
RECORD_ATTEMPT = """
INSERT INTO experiment_naive_attempt (run_id, payout_id, owner_id)
VALUES (%(run)s, %(payout)s, %(owner)s) RETURNING attempt_id
"""
RESOLVE_ATTEMPT = """
UPDATE experiment_naive_attempt SET outcome = %(outcome)s, rail_reference = %(ref)s
 WHERE attempt_id = %(attempt)s
"""
FINISH = """
UPDATE experiment_naive_payout
   SET state = %(state)s, rail_reference = COALESCE(%(ref)s, rail_reference),
       updated_at = clock_timestamp()
 WHERE payout_id = %(payout)s AND state = 'CLAIMED'
"""
DEBIT = """
UPDATE experiment_naive_account SET balance_minor = balance_minor - %(amount)s
 WHERE account_id = %(account)s
"""
LEDGER = """
INSERT INTO experiment_naive_ledger (run_id, payout_id, account_id, direction, amount_minor)
VALUES (%(run)s, %(payout)s, %(account)s, 'DEBIT', %(amount)s),
       (%(run)s, %(payout)s, %(settlement)s, 'CREDIT', %(amount)s)
"""


def ensure_tables(pay_url: str) -> None:
    with psycopg.connect(pay_url, autocommit=True) as conn:
        # Two experiments creating the tables at once would race on the catalog.
        conn.execute("SELECT pg_advisory_lock(84218)")
        try:
            conn.execute(DDL)
        finally:
            conn.execute("SELECT pg_advisory_unlock(84218)")


def seed(
    pay_url: str,
    *,
    run_id: str,
    accounts: int,
    payouts_per_account: int,
    balance_minor: int,
    amount_minor: int,
    currency: str = "EUR",
) -> dict[str, list[str]]:
    """Create the naive arm's accounts and PENDING payouts (same shape as `seed_payouts`)."""
    ensure_tables(pay_url)
    account_ids = [f"naive-{run_id}-{i}" for i in range(accounts)]
    payout_ids: list[str] = []
    with psycopg.connect(pay_url) as conn, conn.cursor() as cur:
        for account in account_ids:
            cur.execute(
                "INSERT INTO experiment_naive_account VALUES (%s, %s, %s, %s)",
                (account, run_id, currency, balance_minor),
            )
            cur.execute(
                "INSERT INTO experiment_naive_ledger (run_id, account_id, direction, amount_minor)"
                " VALUES (%s, %s, 'CREDIT', %s)",
                (run_id, account, balance_minor),
            )
        # Interleave accounts like a queue filled over time.
        for _ in range(payouts_per_account):
            for account in account_ids:
                payout = str(uuid.uuid4())
                payout_ids.append(payout)
                cur.execute(
                    "INSERT INTO experiment_naive_payout"
                    " (payout_id, run_id, account_id, amount_minor, currency, state)"
                    " VALUES (%s, %s, %s, %s, %s, 'PENDING')",
                    (payout, run_id, account, amount_minor, currency),
                )
    return {"accounts": account_ids, "payouts": payout_ids}


class NaiveWorker:
    """One naive worker: lease → check → claim → rail → post → release, no token anywhere."""

    def __init__(
        self,
        *,
        pay_url: str,
        rail_url: str,
        run_id: str,
        owner_id: str,
        lease_ms: int,
        pause: PausePlan | None = None,
        until_idle: bool = False,
    ) -> None:
        self.conn = psycopg.connect(pay_url, autocommit=True, connect_timeout=3)
        self.rail_url = rail_url.rstrip("/")
        self.run_id = run_id
        self.owner = owner_id
        self.lease_ms = lease_ms
        self.pause = pause or PausePlan(None)
        self.until_idle = until_idle
        self.stopping = False
        self.http = requests.Session()

    # -- the pause hook (executor.pause) ---------------------------------------------------
    def phase(self, name: str, key: str) -> None:
        self.pause.at(name, wait=self._wait, key=key, ownerId=self.owner)

    def _wait(self, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while not self.stopping and time.monotonic() < deadline:
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
        return self.stopping

    # -- one payout ----------------------------------------------------------------------
    def run_one(self) -> bool:
        """Returns False when there was nothing to do."""
        rows = self.conn.execute(ACCOUNTS_WITH_WORK, {"run": self.run_id}).fetchall()
        if not rows:
            return False
        account = rows[int.from_bytes(os.urandom(2), "big") % len(rows)][0]
        key = f"naive:{self.run_id}:{account}"
        got = self.conn.execute(
            ACQUIRE_LEASE, {"key": key, "owner": self.owner, "ttl": self.lease_ms}
        ).fetchone()
        if not got:
            return True
        deadline = time.monotonic() + self.lease_ms * 0.7 / 1000
        log_event("naive_section_started", key=key, ownerId=self.owner)
        try:
            self.phase("before_claim", key)
            row = self.conn.execute(
                NEXT_PAYOUT, {"run": self.run_id, "account": account}
            ).fetchone()
            if row is None or time.monotonic() > deadline:
                return True
            payout, amount, currency, _state = row
            if not self.conn.execute(CLAIM, {"payout": payout, "owner": self.owner}).rowcount:
                return True
            if time.monotonic() > deadline:  # "my lease is still valid" — checked, then acted on
                return True
            # A pause here, between the check and the act, is the bug.
            self.phase("before_submit", key)
            attempt = self.conn.execute(
                RECORD_ATTEMPT, {"run": self.run_id, "payout": payout, "owner": self.owner}
            ).fetchone()[0]
            outcome, ref = self.submit(str(payout), amount, currency)
            self.conn.execute(RESOLVE_ATTEMPT, {"attempt": attempt, "outcome": outcome, "ref": ref})
            if outcome == "NOT_SENT":
                return True  # nothing presented: the payout stays CLAIMED and is retried
            self.phase("before_post", key)
            state = {"ACKED": "POSTED", "DECLINED": "FAILED"}.get(outcome, "RAIL_AMBIGUOUS")
            with self.conn.transaction():
                moved = self.conn.execute(
                    FINISH, {"state": state, "ref": ref, "payout": payout}
                ).rowcount
                if moved and state == "POSTED":
                    params = {
                        "run": self.run_id,
                        "payout": payout,
                        "account": account,
                        "amount": amount,
                        "settlement": f"naive-settlement-{self.run_id}",
                    }
                    self.conn.execute(DEBIT, params)
                    self.conn.execute(LEDGER, params)
            return True
        finally:
            self.conn.execute(RELEASE_LEASE, {"key": key, "owner": self.owner})

    def submit(self, client_ref: str, amount: int, currency: str) -> tuple[str, str | None]:
        body = {"clientRef": client_ref, "amountMinor": amount, "currency": currency}
        try:
            resp = self.http.post(f"{self.rail_url}/submit", json=body, timeout=(1, 8))
        except requests.ConnectionError as exc:
            if "timed out" in str(exc).lower() or "reset" in str(exc).lower():
                return "TIMEOUT", None
            if "refused" in str(exc).lower():
                return "NOT_SENT", None
            return "TIMEOUT", None
        except requests.RequestException:
            return "TIMEOUT", None
        if resp.status_code == 200:
            try:
                return "ACKED", str(resp.json()["railReference"])
            except (ValueError, KeyError, TypeError):
                return "TIMEOUT", None
        if resp.status_code == 402:
            return "DECLINED", None
        return "TIMEOUT", None

    def loop(self) -> int:
        idle_since: float | None = None
        while not self.stopping:
            try:
                busy = self.run_one()
            except psycopg.OperationalError:
                # PostgreSQL restarted under us: reconnect and carry on (the lease is lost anyway).
                time.sleep(0.5)
                try:
                    self.conn.close()
                    self.conn = psycopg.connect(self.conn.info.dsn, autocommit=True)
                except psycopg.OperationalError:
                    pass
                continue
            if busy:
                idle_since = None
                continue
            idle_since = idle_since or time.monotonic()
            if self.until_idle and time.monotonic() - idle_since > 3:
                return 0
            time.sleep(0.05)
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiment.naive")
    parser.add_argument("--pay-url", required=True)
    parser.add_argument("--rail-url", required=True)
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--owner-id", required=True)
    parser.add_argument("--lease-ms", type=int, default=2000)
    parser.add_argument("--until-idle", action="store_true")
    args = parser.parse_args(argv)
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(JsonFormatter(service="naive-worker"))
    events = logging.getLogger("dlock.events")
    events.addHandler(handler)
    events.setLevel(logging.INFO)
    worker = NaiveWorker(
        pay_url=args.pay_url,
        rail_url=args.rail_url,
        run_id=args.run_id,
        owner_id=args.owner_id,
        lease_ms=args.lease_ms,
        pause=PausePlan.from_env(),
        until_idle=args.until_idle,
    )

    def stop(_signo, _frame) -> None:
        worker.stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    return worker.loop()


if __name__ == "__main__":
    sys.exit(main())
