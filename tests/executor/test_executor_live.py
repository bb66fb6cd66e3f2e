"""The executor as real processes against the four real services: drains, pauses, crashes, revokes.

Every test seeds its own accounts and leaves no payout PENDING, CLAIMED or RAIL_ACKED behind, so
the private stack stays drainable for the next test.
"""

from __future__ import annotations

import json
import os
import signal
import uuid

import pytest
import requests

from devstack.common import free_port, wait_until
from dlock.client import LockClient
from executor.worker import Executor
from tests.executor.conftest import (
    account_ids,
    account_state,
    drain,
    fenced_out_count,
    paydb,
    payout_ids,
    rail_requests,
    rail_transfers,
    seed,
    start_executor,
    states,
)
from tests.executor.conftest import (
    owner_id as _owner,
)

pytestmark = [pytest.mark.live, pytest.mark.slow]

TERMINAL = {"POSTED", "FAILED", "RAIL_AMBIGUOUS"}


def _ledger_legs(stack, payout_id: str) -> list[tuple[str, int]]:
    with paydb(stack) as conn:
        return conn.execute(
            "SELECT direction, amount_minor FROM ledger_entry WHERE payout_id = %s ORDER BY 1",
            (payout_id,),
        ).fetchall()


# --------------------------------------------------------------------------- end to end


def test_two_executors_drain_fifty_payouts_and_nothing_is_presented_twice(
    exec_stack, rail, tmp_path
):
    # A flaky rail: 10 % of calls book the transfer and then drop the connection (ambiguous),
    # 5 % are declined (FAILED after one presentation).
    rail(
        "--failure-rate", "0.1", "--split-5xx", "0", "--split-drop-before", "0",
        "--decline-rate", "0.05",
    )  # fmt: skip
    # 4.5 payouts' worth of balance per account: the fifth claim on each must fail for funds.
    seeded = seed(exec_stack, accounts=10, per_account=5, balance=4_500, amount=1_000)
    ids = payout_ids(seeded)
    assert len(ids) == 50

    drain(exec_stack, tmp_path, _owner("exec-a"), _owner("exec-b"))

    final = states(exec_stack, ids)
    assert set(final.values()) <= TERMINAL, final
    assert "POSTED" in final.values() and "FAILED" in final.values()
    presented = rail_requests(exec_stack, ids)
    booked = rail_transfers(exec_stack, ids)
    assert max(presented.values()) == 1  # the rail was asked at most once per payout
    assert max(booked.values()) == 1
    for pid, state in final.items():
        if state == "POSTED":
            assert booked.get(pid) == 1
            assert _ledger_legs(exec_stack, pid) == [("CREDIT", 1_000), ("DEBIT", 1_000)]
        if state == "FAILED":  # for funds (never presented) or declined (presented once)
            assert booked.get(pid, 0) == 0 and _ledger_legs(exec_stack, pid) == []
    for account_id in account_ids(seeded):
        account = account_state(exec_stack, account_id)
        assert account["balanceMinor"] == account["ledgerSumMinor"] >= 0
    report = exec_stack.manage("reconcile", "--json", check=False)
    assert report.returncode == 0, report.stdout[-3000:]
    body = json.loads(report.stdout)
    assert body["ok"] is True
    ambiguous = [pid for pid, state in final.items() if state == "RAIL_AMBIGUOUS"]
    for pid in ambiguous:  # drop-after-booking: the rail did pay, and the reconciler says so
        assert body["payouts"][pid]["classification"] == "BOOKED_ONCE"


def test_ambiguous_rail_outcome_quarantines_the_payout_and_is_never_resubmitted(
    exec_stack, rail, tmp_path
):
    rail(
        "--failure-rate", "1.0", "--split-5xx", "0", "--split-drop-after", "0", "--hold-ms", "2000"
    )
    seeded = seed(exec_stack, accounts=1, per_account=1, balance=5_000, amount=1_000)
    (pid,) = payout_ids(seeded)
    owner = _owner("exec-amb")
    proc = start_executor(exec_stack, owner, "--until-idle", log_dir=tmp_path)
    assert proc.wait(60) == 0
    assert states(exec_stack, [pid]) == {pid: "RAIL_AMBIGUOUS"}
    assert rail_requests(exec_stack, [pid]) == {pid: 1}
    assert rail_transfers(exec_stack, [pid]) == {}
    assert [e["payoutId"] for e in proc.events("rail_ambiguous")] == [pid]
    # The event names the state the payout is in now, not the one it was picked in (issue 26.5).
    assert [e["state"] for e in proc.events("rail_ambiguous")] == ["RAIL_AMBIGUOUS"]
    outcomes = [e["outcome"] for e in proc.events("payout_executed")]
    assert outcomes == ["ambiguous"]
    body = json.loads(exec_stack.manage("reconcile", "--json").stdout)
    assert body["payouts"][pid]["classification"] == "NOT_BOOKED"


def test_duplicate_submission_is_resolved_from_the_record_and_never_repeated(exec_stack, tmp_path):
    seeded = seed(exec_stack, accounts=1, per_account=1, balance=5_000, amount=1_000)
    (pid,) = payout_ids(seeded)
    (account_id,) = account_ids(seeded)
    # An unresolved submission already exists (a state the proxy itself never leaves behind a
    # CLAIMED payout): the executor's submit must meet DUPLICATE_SUBMISSION at admission step 2.
    with paydb(exec_stack) as conn:
        conn.execute(
            "INSERT INTO rail_submission (submission_id, payout_id, account_id, amount_minor,"
            " currency, presented_token, owner_id, idempotency_key, request_hash, client_ref,"
            " outcome, submitted_at) VALUES (%s, %s, %s, 1000, 'EUR', %s, 'earlier', %s, 'h',"
            " %s, 'TIMEOUT', now())",
            # A token no grant of this stack will reach, so no replay identity collides.
            (str(uuid.uuid4()), pid, account_id, 9 * 10**18, f"payout-{pid}", pid),
        )
    proc = start_executor(exec_stack, _owner("exec-dup"), "--until-idle", log_dir=tmp_path)
    try:
        assert proc.wait(60) == 0
        outcomes = [e["outcome"] for e in proc.events("payout_executed")]
        assert outcomes == ["duplicate"]  # once: the payout is hands-off for this process
        assert rail_requests(exec_stack, [pid]) == {}
        assert states(exec_stack, [pid]) == {pid: "CLAIMED"}
    finally:  # leave nothing drainable behind for the next test
        with paydb(exec_stack) as conn:
            conn.execute("UPDATE payout SET state = 'RAIL_AMBIGUOUS' WHERE payout_id = %s", (pid,))


# --------------------------------------------------------------------------- faults


def test_paused_executor_is_fenced_out_after_another_takes_over_and_nothing_is_paid_twice(
    exec_stack, tmp_path
):
    seeded = seed(exec_stack, accounts=1, per_account=1, balance=5_000, amount=1_000)
    (pid,) = payout_ids(seeded)
    fenced_before = fenced_out_count(exec_stack, "railproxy", "rail")
    stale = start_executor(
        exec_stack,
        _owner("exec-stale"),
        "--max-payouts",
        "1",
        pause="before_submit:stop",
        log_dir=tmp_path,
    )
    stale.wait_stopped()
    assert states(exec_stack, [pid]) == {pid: "CLAIMED"}
    stale_token = stale.events("executor_paused")[0]["token"]

    # While it sleeps past its 2 s lease, another executor recovers the CLAIMED payout.
    drain(exec_stack, tmp_path, _owner("exec-fresh"))
    assert states(exec_stack, [pid]) == {pid: "POSTED"}

    os.kill(stale.pid, signal.SIGCONT)
    assert stale.wait(60) == 0
    fenced = stale.events("executor_fenced_out")
    assert len(fenced) == 1 and fenced[0]["details"]["presentedToken"] == stale_token
    assert fenced[0]["details"]["highestToken"] > stale_token
    assert fenced_out_count(exec_stack, "railproxy", "rail") == fenced_before + 1
    assert rail_requests(exec_stack, [pid]) == {pid: 1}
    assert rail_transfers(exec_stack, [pid]) == {pid: 1}
    assert _ledger_legs(exec_stack, pid) == [("CREDIT", 1_000), ("DEBIT", 1_000)]
    # The proxy's fenced_out line names the stale owner and carries the executor's traceId.
    (proxy_line,) = [
        line
        for line in _service_events(exec_stack, "railproxy", "fenced_out")
        if line.get("payoutId") == pid
    ]
    assert proxy_line["ownerId"] == stale.owner_id
    assert proxy_line["traceId"] == fenced[0]["traceId"]


def _service_events(stack, role: str, event: str) -> list[dict]:
    found = []
    for line in (stack.logdir / f"{role}.log").read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("event") == event:
            found.append(record)
    return found


@pytest.mark.parametrize(
    ("phase", "left_in"), [("before_submit", "CLAIMED"), ("before_post", "RAIL_ACKED")]
)
def test_kill_9_mid_section_is_recovered_by_the_next_holder(
    exec_stack, rail, tmp_path, phase, left_in
):
    seeded = seed(exec_stack, accounts=1, per_account=1, balance=5_000, amount=1_000)
    (pid,) = payout_ids(seeded)
    (account_id,) = account_ids(seeded)
    victim = start_executor(
        exec_stack, _owner("exec-victim"), pause=f"{phase}:stop", log_dir=tmp_path
    )
    victim.wait_stopped()
    assert states(exec_stack, [pid]) == {pid: left_in}
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait(10)

    drain(exec_stack, tmp_path, _owner("exec-recover"))
    assert states(exec_stack, [pid]) == {pid: "POSTED"}
    assert rail_requests(exec_stack, [pid]) == {pid: 1}
    assert rail_transfers(exec_stack, [pid]) == {pid: 1}
    assert _ledger_legs(exec_stack, pid) == [("CREDIT", 1_000), ("DEBIT", 1_000)]
    account = account_state(exec_stack, account_id)
    assert account["balanceMinor"] == account["ledgerSumMinor"] == 4_000


def test_sigterm_mid_section_abandons_releases_and_exits_zero(exec_stack, tmp_path):
    seeded = seed(exec_stack, accounts=1, per_account=1, balance=5_000, amount=1_000)
    (pid,) = payout_ids(seeded)
    (account_id,) = account_ids(seeded)
    port = free_port()
    proc = start_executor(
        exec_stack,
        _owner("exec-term"),
        "--metrics-port",
        str(port),
        "--metrics-addr",
        "127.0.0.1",
        pause="before_submit:60",
        lock_ttl_ms=30_000,
        session_ttl_ms=30_000,
        log_dir=tmp_path,
    )
    wait_until(lambda: proc.events("executor_paused"), timeout=30, what="the pause")
    metrics = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    assert 'payout_execute_total{outcome="posted"} 0.0' in metrics
    assert "payout_backlog_age_seconds" in metrics

    proc.process.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    assert proc.events("executor_section_abandoned")
    assert proc.events("executor_stopped")
    locks = LockClient(exec_stack.url("lockserver"), "observer")
    assert locks.info(f"payout:{account_id}")["held"] is False  # released, not left to expire
    assert states(exec_stack, [pid]) == {pid: "CLAIMED"}

    drain(exec_stack, tmp_path, _owner("exec-after-term"))
    assert states(exec_stack, [pid]) == {pid: "POSTED"}


def _payout_reads(stack) -> float:
    """P4 answers the payment resource has given (its request metrics, every status)."""
    text = requests.get(f"{stack.url('payments')}/metrics", timeout=5).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("django_http_responses_total_by_status_view_method_total{")
        and 'view="payout-detail"' in line
        and 'method="GET"' in line
    )


def test_a_listed_payout_is_claimed_without_reading_it_first_and_paid_to_its_own_beneficiary(
    exec_stack, tmp_path
):
    """P2's answer carries beneficiaryRef (CHANGELOG 53): no P4 read per payout. The rail proxy
    refuses a submission whose beneficiary is not the payout's (paydb's row), so every payout
    POSTED proves the beneficiary the executor sent was the stored one."""
    seeded = seed(exec_stack, accounts=4, per_account=3, balance=10_000, amount=1_000)
    ids = payout_ids(seeded)
    reads = _payout_reads(exec_stack)

    drain(exec_stack, tmp_path, _owner("exec-noread"))

    assert set(states(exec_stack, ids).values()) == {"POSTED"}
    assert rail_requests(exec_stack, ids) == dict.fromkeys(ids, 1)
    assert _payout_reads(exec_stack) == reads
    for account_id in account_ids(seeded):
        account = account_state(exec_stack, account_id)
        assert account["balanceMinor"] == account["ledgerSumMinor"] == 10_000 - 3 * 1_000


def test_a_stale_listing_is_read_after_the_claim_refuses_it_and_nothing_is_paid_twice(
    exec_stack,
):
    """This executor listed two PENDING payouts; another paid both before it got to them. Each
    claim (PENDING expected) answers PAYOUT_NOT_CLAIMABLE; only then is the payout read (P4),
    found POSTED and skipped; the rail never hears of either again."""
    seeded = seed(exec_stack, accounts=1, per_account=2, balance=10_000, amount=1_000)
    ids = payout_ids(seeded)
    urls = {
        "lock_url": exec_stack.env["LOCK_SERVER_URL"],
        "payments_url": exec_stack.env["PAYMENTS_URL"],
        "rail_proxy_url": exec_stack.env["RAIL_PROXY_URL"],
    }
    late = Executor(owner_id=_owner("exec-late"), **urls)
    listed = [c for c in late.api.list_payouts("PENDING", max_items=500) if c.payout_id in ids]
    assert sorted(c.payout_id for c in listed) == sorted(ids)
    early = Executor(owner_id=_owner("exec-early"), **urls)
    assert early.run(until_idle=True) == 0
    assert set(states(exec_stack, ids).values()) == {"POSTED"}
    reads = _payout_reads(exec_stack)
    try:
        outcomes = [late.run_one_payout(candidate).label for candidate in listed]
    finally:
        late.close()
    assert outcomes == ["skipped", "skipped"]
    assert _payout_reads(exec_stack) == reads + 2  # read only after the claim refused
    assert rail_requests(exec_stack, ids) == dict.fromkeys(ids, 1)
    account = account_state(exec_stack, account_ids(seeded)[0])
    assert account["balanceMinor"] == account["ledgerSumMinor"] == 10_000 - 2 * 1_000
