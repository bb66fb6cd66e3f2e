"""`manage.py repair_fence` against the four real services, then a real executor."""

from __future__ import annotations

import json
import uuid

import psycopg
import pytest
import requests

from tests.executor.conftest import (
    account_ids,
    drain,
    paydb,
    payout_ids,
    seed,
    states,
)

pytestmark = [pytest.mark.live, pytest.mark.slow]

INT64_MAX = 2**63 - 1


def _repair(stack, *args: str):
    return stack.manage("repair_fence", *args, check=False)


def _issued(stack) -> int:
    """What the lock server (pg backend) has issued, read straight from lockdb."""
    with psycopg.connect(stack.env["LOCK_DATABASE_URL"]) as conn:
        last, called = conn.execute(
            "SELECT last_value, is_called FROM fencing_token_seq"
        ).fetchone()
    return last if called else last - 1


def _fences(stack, account_id: str) -> tuple[int, int | None]:
    with paydb(stack) as conn:
        (fence,) = conn.execute(
            "SELECT fence FROM account WHERE account_id = %s", (account_id,)
        ).fetchone()
        high = conn.execute(
            "SELECT highest_token FROM rail_high_water WHERE account_id = %s", (account_id,)
        ).fetchone()
    return fence, high[0] if high else None


def _audit(stack, account_id: str) -> list[tuple]:
    with paydb(stack) as conn:
        return conn.execute(
            "SELECT operator, reason, lock_backend, issued_bound, old_fence, new_fence,"
            "       old_rail_high_water, new_rail_high_water"
            "  FROM fence_repair WHERE account_id = %s ORDER BY repair_id",
            (account_id,),
        ).fetchall()


def _books(stack, account_id: str) -> tuple[int, int]:
    with paydb(stack) as conn:
        return conn.execute(
            "SELECT a.balance_minor, COALESCE(SUM(CASE e.direction WHEN 'CREDIT'"
            " THEN e.amount_minor ELSE -e.amount_minor END), 0)"
            "  FROM account a LEFT JOIN ledger_entry e ON e.account_id = a.account_id"
            " WHERE a.account_id = %s GROUP BY a.balance_minor",
            (account_id,),
        ).fetchone()


def _runaway(stack) -> tuple[str, str]:
    """One payout CLAIMED by a forged token 2^63−1 that also raised the fence and the rail
    high-water mark: no token the lock server can issue passes either."""
    seeded = seed(stack, accounts=1, per_account=1, balance=5_000, amount=1_000)
    (pid,), (account_id,) = payout_ids(seeded), account_ids(seeded)
    with paydb(stack) as conn:
        conn.execute(
            "UPDATE payout SET state = 'CLAIMED', claim_token = %s, claim_owner_id = 'forger',"
            " attempt_count = attempt_count + 1 WHERE payout_id = %s",
            (INT64_MAX, pid),
        )
        conn.execute("UPDATE account SET fence = %s WHERE account_id = %s", (INT64_MAX, account_id))
        conn.execute(
            "INSERT INTO rail_high_water (account_id, highest_token, updated_at)"
            " VALUES (%s, %s, now())",
            (account_id, INT64_MAX),
        )
    return pid, account_id


def test_a_runaway_fence_is_lowered_to_the_issued_bound_audited_and_the_payout_then_posts(
    ops_stack, tmp_path
):
    pid, account_id = _runaway(ops_stack)

    result = _repair(
        ops_stack,
        "--account", account_id,
        "--reason", "fence raised by a forged token before #12",
        "--operator", "alice",
        "--json",
        "--log-json",  # its events on the terminal (stderr), not in the events log
    )  # fmt: skip

    assert result.returncode == 0, result.stdout + result.stderr
    bound = _issued(ops_stack)
    body = json.loads(result.stdout)
    assert body["issuedBound"] == bound and body["lockBackend"] == "pg"
    assert (body["oldFence"], body["newFence"]) == (INT64_MAX, bound)
    assert (body["oldRailHighWater"], body["newRailHighWater"]) == (INT64_MAX, bound)
    assert _fences(ops_stack, account_id) == (bound, bound)
    assert _audit(ops_stack, account_id) == [
        (
            "alice",
            "fence raised by a forged token before #12",
            "pg",
            bound,
            INT64_MAX,
            bound,
            INT64_MAX,
            bound,
        )
    ]
    events = [json.loads(line) for line in result.stderr.splitlines() if "fence_repaired" in line]
    assert len(events) == 1
    event = events[0]
    assert event["event"] == "fence_repaired" and event["level"] == "WARNING"
    assert event["accountId"] == account_id and event["operator"] == "alice"
    assert (event["oldFence"], event["newFence"]) == (INT64_MAX, bound)
    metrics = requests.get(f"{ops_stack.url('payments')}/metrics", timeout=5).text
    assert "# TYPE fence_repaired_total counter" in metrics

    # The next legitimate grant is above the bound: the executor recovers the claim and pays.
    drain(ops_stack, tmp_path, f"exec-repaired-{uuid.uuid4().hex[:6]}")
    assert states(ops_stack, [pid]) == {pid: "POSTED"}
    balance, ledger_sum = _books(ops_stack, account_id)
    assert balance == ledger_sum == 4_000
    fence, high = _fences(ops_stack, account_id)
    assert bound < fence < INT64_MAX and bound < high < INT64_MAX


def test_repair_of_a_healthy_account_is_refused_and_changes_nothing(ops_stack):
    seeded = seed(ops_stack, accounts=1, per_account=1, balance=5_000, amount=1_000)
    (account_id,) = account_ids(seeded)
    with paydb(ops_stack) as conn:
        conn.execute(
            "INSERT INTO rail_high_water (account_id, highest_token, updated_at)"
            " VALUES (%s, %s, now())",
            (account_id, _issued(ops_stack)),
        )
    before = _fences(ops_stack, account_id)

    result = _repair(ops_stack, "--account", account_id, "--reason", "just checking it works")

    assert result.returncode == 1, result.stdout + result.stderr
    assert "healthy" in result.stderr and "nothing changed" in result.stderr
    assert "Traceback" not in result.stderr
    assert _fences(ops_stack, account_id) == before
    assert _audit(ops_stack, account_id) == []


def test_repair_without_a_reason_is_refused_and_changes_nothing(ops_stack, tmp_path):
    pid, account_id = _runaway(ops_stack)

    missing = _repair(ops_stack, "--account", account_id)
    blank = _repair(ops_stack, "--account", account_id, "--reason", "   ")

    assert missing.returncode != 0 and "--reason" in missing.stderr
    assert blank.returncode == 1 and "--reason" in blank.stderr
    assert _fences(ops_stack, account_id) == (INT64_MAX, INT64_MAX)
    assert _audit(ops_stack, account_id) == []
    # leave the stack drainable for the next test: repair it properly, then pay it
    assert _repair(ops_stack, "--account", account_id, "--reason", "test clean-up").returncode == 0
    drain(ops_stack, tmp_path, f"exec-repaired-{uuid.uuid4().hex[:6]}")
    assert states(ops_stack, [pid]) == {pid: "POSTED"}


def test_repair_of_an_unknown_account_is_refused(ops_stack):
    result = _repair(ops_stack, "--account", "acct-nobody", "--reason", "typo in the account id")
    assert result.returncode == 1 and "not found" in result.stderr
    assert _audit(ops_stack, "acct-nobody") == []
