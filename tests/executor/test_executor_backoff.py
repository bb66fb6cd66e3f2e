"""Issue 19.2: an executor never spins on a payout it cannot move.

An account's fence is set to 2^63−1 (as a forged-token claim left it) under a CLAIMED payout:
no token the lock server will issue passes it. `run_executor --until-idle` must back off that
account (a handful of fenced-out events, not a flood), pay every other account, and exit
non-zero within a bounded time, naming the payout in its last log line.
"""

from __future__ import annotations

import json
import time
import uuid

import pytest

from executor.backoff import AccountBackoff
from executor.dispatch import EXIT_BACKED_OFF
from tests.executor.conftest import account_ids, paydb, payout_ids, seed, start_executor, states

pytestmark = [pytest.mark.live, pytest.mark.slow]

MAX_FENCE = 2**63 - 1


def test_an_unpassable_fence_is_backed_off_others_flow_and_the_run_exits_non_zero(
    exec_stack, tmp_path
):
    seeded = seed(exec_stack, accounts=3, per_account=2, balance=100_000, amount=100)
    ids = payout_ids(seeded)
    stuck_account = account_ids(seeded)[0]
    with paydb(exec_stack) as conn:
        stuck = [
            str(pid)
            for (pid,) in conn.execute(
                "SELECT payout_id FROM payout WHERE account_id = %s ORDER BY created_at",
                (stuck_account,),
            ).fetchall()
        ]
        conn.execute(
            "UPDATE payout SET state = 'CLAIMED', claim_token = 7, claim_owner_id = 'gone'"
            " WHERE payout_id = %s",
            (stuck[0],),
        )
        conn.execute(
            "UPDATE account SET fence = %s WHERE account_id = %s", (MAX_FENCE, stuck_account)
        )
    try:
        started = time.monotonic()
        proc = start_executor(
            exec_stack, f"exec-stuck-{uuid.uuid4().hex[:6]}", "--until-idle", log_dir=tmp_path
        )
        code = proc.wait(60)
        elapsed = time.monotonic() - started
        assert code == EXIT_BACKED_OFF, proc.log.read_text()[-3000:]
        assert elapsed < 45
        fenced = proc.events("executor_fenced_out")
        assert 1 <= len(fenced) <= 8, len(fenced)  # a handful, not a flood
        backoffs = proc.events("executor_backoff")
        assert backoffs and all(b["accountId"] == stuck_account for b in backoffs)
        assert len(backoffs) <= len(fenced)  # at most one event per back-off step
        steps = [b["step"] for b in backoffs if b["payoutId"] == backoffs[0]["payoutId"]]
        assert steps == sorted(steps)
        lines = [json.loads(line) for line in proc.log.read_text().strip().splitlines()]
        (stopped,) = [e for e in lines if e["event"] == "executor_stopped"]
        assert stopped["exitCode"] == EXIT_BACKED_OFF
        assert set(stopped["backedOff"]) == set(stuck)  # both payouts of the account, by id
        # the process's last word is its lifecycle line, with the same exit code
        assert lines[-1]["event"] == "service_stopped"
        assert lines[-1]["exitCode"] == EXIT_BACKED_OFF
        final = states(exec_stack, ids)
        others = [pid for pid in ids if pid not in stuck]
        assert {final[pid] for pid in others} == {"POSTED"}
        assert final[stuck[0]] == "CLAIMED"  # untouched: nothing was written under the fence
        with paydb(exec_stack) as conn:
            (fence,) = conn.execute(
                "SELECT fence FROM account WHERE account_id = %s", (stuck_account,)
            ).fetchone()
        assert fence == MAX_FENCE
    finally:  # leave the shared stack drainable for the next test
        with paydb(exec_stack) as conn:
            conn.execute(
                "UPDATE payout SET state = 'ABANDONED' WHERE payout_id = ANY(%s::uuid[])", (stuck,)
            )


def test_backoff_grows_bounded_with_jitter_and_progress_clears_it():
    now = [100.0]
    backoff = AccountBackoff(
        initial_s=0.5, max_s=4.0, give_up_steps=3, clock=lambda: now[0], random_fn=lambda: 1.0
    )
    delays = [backoff.note(account_id="a", payout_id="p", outcome="fenced_out") for _ in range(6)]
    assert delays == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert backoff.blocked("a") and not backoff.blocked("b")
    assert backoff.stuck() == {"a": "fenced_out"}
    # a refusal backs off only when it repeats; progress clears everything
    assert backoff.note(account_id="b", payout_id="q", outcome="not_claimable") is None
    assert backoff.note(account_id="b", payout_id="q", outcome="not_claimable") == 0.5
    backoff.note(account_id="a", payout_id="p", outcome="posted")
    assert not backoff.blocked("a") and backoff.stuck() == {}
    now[0] += 1.0
    assert not backoff.blocked("b")
    jittered = AccountBackoff(initial_s=1.0, random_fn=lambda: 0.0)
    assert jittered.note(account_id="c", payout_id="r", outcome="fenced_out") == 0.5
