"""Issue 17: one executor process, one lock session, up to N payouts in flight on N accounts.

The rail stub answers after 400 ms, so sections overlap only if the process really runs them at
once. Overlap is read from paydb's payout_event rows (CLAIMED → POSTED per payout), not from the
executor's own logs.
"""

from __future__ import annotations

import os
import signal
import time
from datetime import datetime

import pytest
import requests

from devstack.common import wait_until
from tests.executor.conftest import (
    account_ids,
    paydb,
    payout_ids,
    rail_requests,
    seed,
    start_executor,
    states,
)
from tests.executor.conftest import (
    owner_id as _owner,
)

pytestmark = [pytest.mark.live, pytest.mark.slow]


def _intervals(stack, ids: list[str]) -> dict[str, tuple[datetime, datetime, str]]:
    """payoutId → (CLAIMED at, POSTED at, accountId) from the payment resource's own events."""
    with paydb(stack) as conn:
        rows = conn.execute(
            "SELECT e.payout_id::text, e.to_state, e.at, p.account_id FROM payout_event e"
            " JOIN payout p USING (payout_id) WHERE e.payout_id::text = ANY(%s)"
            " AND e.to_state IN ('CLAIMED', 'POSTED') ORDER BY e.id",
            (ids,),
        ).fetchall()
    first: dict[str, dict] = {}
    for pid, to_state, at, account in rows:
        first.setdefault(pid, {"account": account}).setdefault(to_state, at)
    return {pid: (v["CLAIMED"], v["POSTED"], v["account"]) for pid, v in first.items()}


def _max_overlap(intervals) -> int:
    points = sorted([(a, 1) for a, _, _ in intervals] + [(b, -1) for _, b, _ in intervals])
    depth = best = 0
    for _, step in points:
        depth += step
        best = max(best, depth)
    return best


def _drain_rest(stack, tmp_path, ids: list[str]) -> None:
    proc = start_executor(stack, _owner("exec-rest"), "--until-idle", log_dir=tmp_path)
    assert proc.wait(120) == 0, proc.log.read_text()[-3000:]
    assert set(states(stack, ids).values()) == {"POSTED"}


def _books_balanced(stack, accounts) -> None:
    for account in accounts:
        body = requests.get(f"{stack.url('payments')}/v1/accounts/{account}", timeout=5).json()
        assert body["balanceMinor"] == body["ledgerSumMinor"] >= 0, body


def test_n_payouts_on_n_accounts_overlap_in_one_process(exec_stack, rail, tmp_path):
    rail("--latency-ms", "400")
    seeded = seed(exec_stack, accounts=4, per_account=1, balance=100_000, amount=100)
    ids = payout_ids(seeded)
    proc = start_executor(
        exec_stack, _owner("exec-conc"), "--until-idle", "--concurrency", "4", log_dir=tmp_path
    )
    assert proc.wait(120) == 0, proc.log.read_text()[-3000:]
    assert set(states(exec_stack, ids).values()) == {"POSTED"}
    intervals = _intervals(exec_stack, ids)
    assert _max_overlap(intervals.values()) >= 3, intervals  # one process, sections at once
    assert len({e["sessionId"] for e in proc.events("lock_session_lost")}) == 0
    assert set(rail_requests(exec_stack, ids).values()) == {1}
    _books_balanced(exec_stack, account_ids(seeded))


def test_two_payouts_of_one_account_never_overlap_in_one_process(exec_stack, rail, tmp_path):
    rail("--latency-ms", "300")
    seeded = seed(exec_stack, accounts=2, per_account=4, balance=100_000, amount=100)
    ids = payout_ids(seeded)
    proc = start_executor(
        exec_stack, _owner("exec-one-acct"), "--until-idle", "--concurrency", "8", log_dir=tmp_path
    )
    assert proc.wait(120) == 0, proc.log.read_text()[-3000:]
    assert set(states(exec_stack, ids).values()) == {"POSTED"}
    intervals = _intervals(exec_stack, ids)
    for account in account_ids(seeded):
        mine = sorted(v for v in intervals.values() if v[2] == account)
        assert len(mine) == 4
        for (_, posted, _), (claimed, _, _) in zip(mine, mine[1:], strict=False):
            assert posted <= claimed, mine  # the next claim only after the previous post
    assert _max_overlap(intervals.values()) >= 2  # the two accounts did run side by side
    executed = proc.events("payout_executed")
    # no self-contention, ever
    assert not [e for e in executed if e["outcome"] in ("lock_contended", "fenced_out")]


def test_lock_server_stopped_aborts_every_section_before_its_next_write(exec_stack, rail, tmp_path):
    rail("--latency-ms", "1000")  # below the proxy's 1.5 s rail read timeout
    seeded = seed(exec_stack, accounts=4, per_account=1, balance=100_000, amount=100)
    ids = payout_ids(seeded)
    proc = start_executor(
        exec_stack, _owner("exec-hb"), "--concurrency", "4", log_dir=tmp_path
    )  # a long-running executor: it must outlive the outage
    lockserver = exec_stack.procs["lockserver"]
    try:
        wait_until(
            lambda: len([e for e in proc.events("executor_hop") if e["hop"] == "claim"]) >= 4,
            timeout=60,
            what="four sections past their claim",
        )
        # Killed, not drained: a draining lock server still answers requests that arrive on
        # kept-alive connections for gunicorn's 2 s linger (heartbeats and renews included, on
        # the executor's pooled connections), and this test is about the heartbeat being lost.
        os.killpg(lockserver.process.pid, signal.SIGKILL)
        lockserver.process.wait()
        wait_until(lambda: proc.events("lock_session_lost"), timeout=30, what="the lost session")
        (lost,) = proc.events("lock_session_lost")[:1]
        lost_at = datetime.fromisoformat(lost["ts"])
        wait_until(
            lambda: len(proc.events("payout_executed")) >= 4, timeout=30, what="every section"
        )
        time.sleep(1.0)
        with paydb(exec_stack) as conn:
            late = conn.execute(
                "SELECT payout_id::text, to_state, at FROM payout_event"
                " WHERE payout_id::text = ANY(%s) AND to_state IN ('CLAIMED', 'POSTED')"
                " AND at > %s",
                (ids, lost_at),
            ).fetchall()
        assert late == [], late  # no protected write after the heartbeat was lost
        outcomes = {e["payoutId"]: e["outcome"] for e in proc.events("payout_executed")}
        assert set(outcomes.values()) <= {"lock_lost", "error", "ambiguous"}, outcomes
        assert proc.process.poll() is None  # the outage did not end the process
    finally:
        if lockserver.process.poll() is not None:
            lockserver.start()
    proc.process.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0, proc.log.read_text()[-3000:]
    rail("--reset")
    _drain_rest(exec_stack, tmp_path, ids)
    assert set(rail_requests(exec_stack, ids).values()) == {1}  # recovery never re-presented


def test_sigterm_with_n_in_flight_drains_releases_and_exits_zero(exec_stack, rail, tmp_path):
    rail("--latency-ms", "1000")
    seeded = seed(exec_stack, accounts=4, per_account=2, balance=100_000, amount=100)
    ids = payout_ids(seeded)
    proc = start_executor(exec_stack, _owner("exec-term"), "--concurrency", "4", log_dir=tmp_path)
    wait_until(
        lambda: len([e for e in proc.events("executor_hop") if e["hop"] == "claim"]) >= 4,
        timeout=60,
        what="four sections in flight",
    )
    sent = time.monotonic()
    proc.process.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0, proc.log.read_text()[-3000:]
    assert time.monotonic() - sent < 20  # inside the drain budget
    (draining,) = proc.events("executor_draining")
    assert draining["inflight"] >= 1
    started = {e["payoutId"] for e in proc.events("executor_section_started")}
    ended = {e["payoutId"] for e in proc.events("payout_executed")}
    assert started <= ended  # every section finished or abandoned, none cut off
    assert proc.events("executor_drain_late") == []
    final = states(exec_stack, ids)
    assert "SUBMITTING" not in final.values(), final
    assert proc.events("lock_session_close_failed") == []
    rail("--reset")
    _drain_rest(exec_stack, tmp_path, ids)
    assert set(rail_requests(exec_stack, ids).values()) == {1}


def test_sigstop_of_a_concurrent_process_past_its_lease_is_fenced_out_and_pays_nothing_twice(
    exec_stack, tmp_path
):
    seeded = seed(exec_stack, accounts=4, per_account=1, balance=100_000, amount=100)
    ids = payout_ids(seeded)
    stale = start_executor(
        exec_stack,
        _owner("exec-stale-conc"),
        "--until-idle",
        "--concurrency",
        "4",
        pause="before_submit:stop",  # the whole process freezes, every section with it
        log_dir=tmp_path,
    )
    stale.wait_stopped()
    time.sleep(2.5)  # past its 2 s leases and session
    fresh = start_executor(exec_stack, _owner("exec-fresh-conc"), "--until-idle", log_dir=tmp_path)
    assert fresh.wait(120) == 0, fresh.log.read_text()[-3000:]
    assert set(states(exec_stack, ids).values()) == {"POSTED"}
    stale.process.send_signal(signal.SIGCONT)
    assert stale.wait(60) == 0, stale.log.read_text()[-3000:]
    (paused,) = stale.events("executor_paused")
    fenced = stale.events("executor_fenced_out")
    # the paused section had passed ensure_valid(): its submit is refused by the fence (so is
    # any other section frozen between its check and its write); the rest stop on LockLost
    assert paused["payoutId"] in {f["payoutId"] for f in fenced}
    assert 1 <= len(fenced) <= 4
    for event in fenced:
        assert event["details"]["presentedToken"] < event["details"]["highestToken"]
    outcomes = [e["outcome"] for e in stale.events("payout_executed")]
    assert "posted" not in outcomes
    assert set(rail_requests(exec_stack, ids).values()) == {1}  # nothing presented twice
    assert set(states(exec_stack, ids).values()) == {"POSTED"}
    _books_balanced(exec_stack, account_ids(seeded))
