"""Issue 16 on the client/executor side: endpoint lists, failover, outages, no false FENCED_OUT.

Real processes on loopback: a second lock-server replica (same lockdb) is started, put first in
the list, and killed while the client or executor works; payment-resource is stopped under an
`--until-idle` run; a release that times out is reproduced in-process.
"""

from __future__ import annotations

import logging
import os
import signal
import time
import uuid

import pytest
import requests

from devstack.common import wait_until
from dlock.client import Grant, LockClient, ServiceUnreachable
from executor.worker import Executor
from tests.executor.conftest import (
    account_ids,
    closed_port_url,
    fenced_out_count,
    payout_ids,
    rail_requests,
    second_replica,
    seed,
    start_executor,
    states,
)
from tests.executor.conftest import (
    owner_id as _owner,
)

pytestmark = [pytest.mark.live, pytest.mark.slow]


def _kill_9(replica) -> None:
    """kill -9 of the replica's whole process group (gunicorn master and workers)."""
    os.killpg(replica.process.pid, signal.SIGKILL)
    replica.process.wait()


def _books_balanced(stack, accounts: list[str]) -> None:
    for account_id in accounts:
        body = requests.get(f"{stack.url('payments')}/v1/accounts/{account_id}", timeout=5).json()
        assert body["balanceMinor"] == body["ledgerSumMinor"] >= 0, body


def test_client_keeps_working_through_the_other_replica_when_one_is_killed(exec_stack, tmp_path):
    replica = second_replica(exec_stack, "lockserver", tmp_path)
    client = LockClient(f"{replica.url},{exec_stack.url('lockserver')}", _owner("ha-client"))
    key = f"test:ha:{uuid.uuid4().hex[:8]}"
    with client.session(ttl_ms=3_000) as session:
        first = session.acquire(key, 3_000)
        assert client.base_url == replica.url  # the first of the list while it answers
        first.release()
        _kill_9(replica)  # connects are refused from now on
        time.sleep(1.5)  # heartbeats (every 1 s) must have moved on by themselves
        assert session.lost is None
        second = session.acquire(key, 3_000)  # no error: the call went to the other replica
        assert second.token > first.token
        assert client.base_url == exec_stack.url("lockserver")
        second.ensure_valid()
        assert second.release() is True


def test_a_list_of_only_dead_replicas_says_nothing_was_sent():
    client = LockClient(f"{closed_port_url()},{closed_port_url()}", _owner("ha-dead"))
    with pytest.raises(ServiceUnreachable) as caught:
        client.open_session(2_000, heartbeat=False)
    assert caught.value.sent is False


def test_executor_fails_over_between_replicas_and_pays_everything_once(exec_stack, tmp_path):
    seeded = seed(exec_stack, accounts=4, per_account=4, balance=100_000, amount=100)
    ids = payout_ids(seeded)
    replica = second_replica(exec_stack, "lockserver", tmp_path)
    stack_env = exec_stack.env
    proc = start_executor(
        exec_stack,
        _owner("exec-ha"),
        "--until-idle",
        log_dir=tmp_path,
        env_overrides={
            "LOCK_SERVER_URL": f"{replica.url},{stack_env['LOCK_SERVER_URL']}",
            # a payments replica that is down from the start, and a rail proxy one too
            "PAYMENTS_URL": f"{closed_port_url()},{stack_env['PAYMENTS_URL']}",
            "RAIL_PROXY_URL": f"{closed_port_url()},{stack_env['RAIL_PROXY_URL']}",
        },
    )
    wait_until(lambda: proc.events("executor_hop"), timeout=60, what="the first hop")
    _kill_9(replica)
    assert proc.wait(120) == 0, proc.log.read_text()[-3000:]
    final = states(exec_stack, ids)
    assert set(final.values()) == {"POSTED"}, final
    assert set(rail_requests(exec_stack, ids).values()) == {1}
    _books_balanced(exec_stack, account_ids(seeded))
    assert proc.events("executor_fenced_out") == []


def test_until_idle_waits_out_a_payments_outage_instead_of_exiting(exec_stack, tmp_path):
    seeded = seed(exec_stack, accounts=2, per_account=2, balance=100_000, amount=100)
    ids = payout_ids(seeded)
    payments = exec_stack.procs["payments"]
    payments.stop()
    try:
        proc = start_executor(
            exec_stack, _owner("exec-outage"), "--until-idle", "--idle-timeout-s", "2",
            log_dir=tmp_path,
        )  # fmt: skip
        wait_until(lambda: proc.events("executor_list_failed"), timeout=60, what="the outage")
        time.sleep(4)  # twice the idle timeout, all of it outage
        assert proc.process.poll() is None, proc.log.read_text()[-3000:]
    finally:
        payments.start()
    assert proc.wait(120) == 0, proc.log.read_text()[-3000:]
    assert set(states(exec_stack, ids).values()) == {"POSTED"}
    _books_balanced(exec_stack, account_ids(seeded))


def test_a_timed_out_release_never_becomes_a_false_fenced_out(exec_stack, monkeypatch, caplog):
    """Issue 16.3: the release of payout 1's grant times out, so the server still holds it and
    is asked again by the same session for payout 2. Had it handed the same token back, payout
    2's claim would be refused as stale (fence == token): a false FENCED_OUT."""
    seeded = seed(exec_stack, accounts=1, per_account=2, balance=100_000, amount=100)
    ids = payout_ids(seeded)
    real_release = Grant.release
    timed_out: list[int] = []

    def release_that_times_out_once(grant: Grant) -> bool:
        if not timed_out:
            # What a DELETE lost in an election looks like to the client: it gave up, the
            # server still holds the grant for this session.
            timed_out.append(grant.token)
            grant._released = True
            grant._session.forget(grant)
            return False
        return real_release(grant)

    monkeypatch.setattr(Grant, "release", release_that_times_out_once)
    before = fenced_out_count(exec_stack, "payments", "account")
    executor = Executor(
        owner_id=_owner("exec-release"),
        lock_url=exec_stack.env["LOCK_SERVER_URL"],
        payments_url=exec_stack.env["PAYMENTS_URL"],
        rail_proxy_url=exec_stack.env["RAIL_PROXY_URL"],
        lock_ttl_ms=5_000,
        session_ttl_ms=5_000,
    )
    with caplog.at_level(logging.INFO, logger="dlock.events"):
        assert executor.run(until_idle=True) == 0
    events = [r.__dict__.get("event") for r in caplog.records]
    assert timed_out, "the fault was not injected"
    tokens = [
        r.__dict__["token"]
        for r in caplog.records
        if r.__dict__.get("event") == "executor_section_started"
    ]
    assert len(tokens) == 2 and tokens[1] > tokens[0] == timed_out[0]
    # The lock server rotated the token on the re-acquire (CHANGELOG row 43: a second L4 by
    # the holding session gets a new, higher token), so the next claim is not stale.
    assert "executor_fenced_out" not in events
    assert executor.outcomes.get("fenced_out", 0) == 0
    assert set(states(exec_stack, ids).values()) == {"POSTED"}
    assert fenced_out_count(exec_stack, "payments", "account") == before
    _books_balanced(exec_stack, account_ids(seeded))
