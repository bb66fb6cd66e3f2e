"""The same capacity and deadline behaviour on a real endpoint: the payments role's P2 claim
blocked by a held account row lock answers 504 and leaves nothing behind, while a concurrent
read that can't get the only database slot answers 503 OVERLOADED."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest
import requests

from devstack.common import free_port, wait_until
from devstack.roles import RoleProcess
from dlock import proof
from tests.production.conftest import migrated_paydb, seed_payouts

pytestmark = [pytest.mark.live, pytest.mark.slow]


@pytest.fixture
def payments(tmp_path):
    db_url, env = migrated_paydb("prod_pay")
    ids = seed_payouts(env, payouts=1)
    limits = {"DB_POOL_MAX": "1", "DB_QUEUE_DEADLINE_MS": "300", "DB_STATEMENT_TIMEOUT_MS": "2000"}
    proc = RoleProcess("payments", free_port(), {**env, **limits}, tmp_path / "payments.log")
    proc.start()
    yield proc, db_url, ids["accounts"][0], ids["payouts"][0]
    proc.stop()


def sql(db_url: str, statement: str, params: tuple = ()) -> list[tuple]:
    with psycopg.connect(db_url, autocommit=True) as conn:
        cur = conn.execute(statement, params)
        return cur.fetchall() if cur.description else []


def claim(url: str, payout_id: str, token: int, account_id: str) -> requests.Response:
    return requests.post(
        f"{url}/v1/payouts/{payout_id}/claim",
        json={"expectedState": "PENDING"},
        headers={
            "X-Fencing-Token": str(token),
            "X-Fencing-Proof": proof.sign(key=proof.payout_key(account_id), token=token),
            "X-Owner-Id": "capacity-test",
            "X-Idempotency-Key": f"payout-{payout_id}",
        },
        timeout=30,
    )


def test_a_claim_blocked_on_the_account_row_is_504_rolled_back_and_a_read_is_503(payments):
    proc, db_url, account_id, payout_id = payments
    events_before = sql(
        db_url, "SELECT count(*) FROM payout_event WHERE payout_id = %s", (payout_id,)
    )
    holder = psycopg.connect(db_url)
    holder.execute("SELECT fence FROM account WHERE account_id = %s FOR UPDATE", (account_id,))
    try:
        with ThreadPoolExecutor(1) as pool:
            blocked = pool.submit(claim, proc.url, payout_id, 5, account_id)
            wait_until(
                lambda: (
                    sql(
                        db_url,
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                        "AND wait_event_type = 'Lock'",
                    )
                    == [(1,)]
                ),
                timeout=20,
                what="claim blocked on the account row",
            )
            read = requests.get(f"{proc.url}/v1/accounts/{account_id}", timeout=30)
            deadline = blocked.result()
    finally:
        holder.rollback()
        holder.close()

    assert read.status_code == 503, read.text
    assert read.json()["code"] == "OVERLOADED" and read.json()["retryAfterMillis"] > 0
    assert deadline.status_code == 504, deadline.text
    assert deadline.json()["code"] == "DEADLINE_EXCEEDED" and deadline.json()["retrySafe"]
    # Nothing of the claim survived: state, events, fence.
    assert sql(db_url, "SELECT state FROM payout WHERE payout_id = %s", (payout_id,)) == [
        ("PENDING",)
    ]
    assert (
        sql(db_url, "SELECT count(*) FROM payout_event WHERE payout_id = %s", (payout_id,))
        == events_before
    )
    assert sql(db_url, "SELECT fence FROM account WHERE account_id = %s", (account_id,)) == [(0,)]
    # Retry-safe means it: the same request now succeeds.
    retried = claim(proc.url, payout_id, 5, account_id)
    assert retried.status_code == 200, retried.text
    assert retried.json()["state"] == "CLAIMED" and retried.json()["claimToken"] == 5


def test_forty_reads_shed_for_want_of_a_database_slot_write_no_error_line(payments):
    """Pool sheds are answered 503 OVERLOADED each, and logged as aggregated
    `dependency_failure` events (one a second at most, with a count), never one ERROR line per
    request."""
    proc, db_url, account_id, payout_id = payments
    offset = proc.logfile.stat().st_size
    holder = psycopg.connect(db_url)
    holder.execute("SELECT fence FROM account WHERE account_id = %s FOR UPDATE", (account_id,))
    try:
        with ThreadPoolExecutor(1) as pool:
            blocked = pool.submit(claim, proc.url, payout_id, 7, account_id)
            wait_until(
                lambda: (
                    sql(
                        db_url,
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                        "AND wait_event_type = 'Lock'",
                    )
                    == [(1,)]
                ),
                timeout=20,
                what="claim blocked on the account row",
            )
            reads = [
                requests.get(f"{proc.url}/v1/accounts/{account_id}", timeout=30) for _ in range(40)
            ]
            blocked.result()
    finally:
        holder.rollback()
        holder.close()
    shed = [read for read in reads if read.status_code == 503]
    assert len(shed) >= 2 and all(read.json()["code"] == "OVERLOADED" for read in shed)
    with open(proc.logfile, "rb") as log:
        log.seek(offset)
        lines = [json.loads(line) for line in log.read().splitlines() if line.startswith(b"{")]
    assert [line for line in lines if line.get("level") == "ERROR"] == []
    events = [line for line in lines if line.get("event") == "dependency_failure"]
    assert 1 <= len(events) < len(shed)
    assert sum(event["count"] for event in events) <= len(shed) + 1
