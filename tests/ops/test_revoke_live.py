"""Operator revoke (L8 + the fence push) against the four real services and real executors."""

from __future__ import annotations

import json
import os
import signal
import uuid

import pytest

from devstack.common import free_port
from devstack.roles import manage
from dlock.client import LockClient
from tests.executor.conftest import (
    account_ids,
    account_state,
    drain,
    fenced_out_count,
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


# --------------------------------------------------------------------------- revoke


def _revoke(stack, key: str, *extra: str, env: dict | None = None):
    return manage(
        [
            "revoke_lock",
            key,
            "--operator",
            "alice",
            "--reason",
            "stuck executor under test",
            "--json",
            *extra,
        ],
        {**stack.env, **(env or {})},
        check=False,
        capture=True,
    )


def _paused_holder(stack, tmp_path, name: str):
    seeded = seed(stack, accounts=1, per_account=1, balance=5_000, amount=1_000)
    (pid,) = payout_ids(seeded)
    (account_id,) = account_ids(seeded)
    holder = start_executor(
        stack,
        _owner(name),
        "--max-payouts",
        "1",
        pause="before_submit:stop",
        lock_ttl_ms=30_000,
        session_ttl_ms=30_000,
        log_dir=tmp_path,
    )
    holder.wait_stopped()
    return pid, account_id, holder, holder.events("executor_paused")[0]["token"]


def test_revoke_pushes_the_floor_so_the_evicted_holder_is_fenced_out_at_once(ops_stack, tmp_path):
    pid, account_id, holder, token = _paused_holder(ops_stack, tmp_path, "exec-revoked")
    fenced_before = fenced_out_count(ops_stack, "railproxy", "rail")

    result = _revoke(ops_stack, f"payout:{account_id}")
    assert result.returncode == 0, result.stderr
    body = json.loads(result.stdout)
    floor = body["newTokenFloor"]
    assert body["revokedToken"] == token and floor > token
    assert body["push"] == {
        "accountId": account_id,
        "accountFence": floor,
        "railHighWater": floor,
        "skipped": None,
    }
    assert account_state(ops_stack, account_id)["fence"] == floor

    os.kill(holder.pid, signal.SIGCONT)
    assert holder.wait(60) == 0
    assert len(holder.events("executor_fenced_out")) == 1
    assert fenced_out_count(ops_stack, "railproxy", "rail") == fenced_before + 1
    assert rail_requests(ops_stack, [pid]) == {}  # the evicted holder never reached the rail
    assert states(ops_stack, [pid]) == {pid: "CLAIMED"}

    drain(ops_stack, tmp_path, _owner("exec-next"))  # the next grant is above the floor
    assert states(ops_stack, [pid]) == {pid: "POSTED"}
    assert rail_requests(ops_stack, [pid]) == {pid: 1}


def test_revoke_without_the_push_leaves_the_fence_so_the_evicted_write_still_lands(
    ops_stack, tmp_path
):
    pid, account_id, holder, token = _paused_holder(ops_stack, tmp_path, "exec-unpushed")
    fenced_before = fenced_out_count(ops_stack, "railproxy", "rail")

    result = _revoke(ops_stack, f"payout:{account_id}", "--no-push")
    assert result.returncode == 0, result.stderr
    body = json.loads(result.stdout)
    assert body["push"]["skipped"] == "--no-push"
    assert account_state(ops_stack, account_id)["fence"] == token  # still the evicted claim's

    # Without the push nothing at the resources knows yet: this is the gap the push closes.
    os.kill(holder.pid, signal.SIGCONT)
    assert holder.wait(60) == 0
    assert holder.events("executor_fenced_out") == []
    assert fenced_out_count(ops_stack, "railproxy", "rail") == fenced_before
    assert states(ops_stack, [pid]) == {pid: "POSTED"}
    assert rail_requests(ops_stack, [pid]) == {pid: 1}  # still paid exactly once


def test_revoke_with_paydb_unreachable_revokes_and_says_the_push_failed(ops_stack):
    key = f"payout:acct-{uuid.uuid4().hex[:10]}"
    client = LockClient(ops_stack.url("lockserver"), "holder")
    with client.session(5_000) as session:
        grant = session.acquire(key, 10_000)
        dead = f"postgres://postgres@127.0.0.1:{free_port()}/paydb"
        result = _revoke(ops_stack, key, env={"PAY_DATABASE_URL": dead})
        assert result.returncode == 2, result.stdout + result.stderr
        body = json.loads(result.stdout)
        assert body["revokedToken"] == grant.token
        assert body["push"]["skipped"].startswith("paydb unreachable")
        assert client.info(key)["held"] is False


def test_revoke_of_a_key_nobody_holds_is_refused_with_exit_1(ops_stack):
    result = _revoke(ops_stack, f"payout:acct-{uuid.uuid4().hex[:10]}")
    assert result.returncode == 1
    body = json.loads(result.stdout)
    assert body["revoked"] is False and body["code"] == "NOT_FOUND"


def test_revoke_that_cannot_reach_the_lock_server_says_nothing_was_revoked_with_exit_2(
    ops_stack,
):
    dead = f"http://127.0.0.1:{free_port()}"
    result = _revoke(ops_stack, "payout:acct-nobody", env={"LOCK_SERVER_URL": dead})
    assert result.returncode == 2, result.stdout + result.stderr
    body = json.loads(result.stdout)
    assert body["revoked"] is False and body["outcomeKnown"] is True
    assert "not reached" in result.stderr


def test_revoke_with_a_stale_expected_token_is_refused(ops_stack):
    key = f"payout:acct-{uuid.uuid4().hex[:10]}"
    client = LockClient(ops_stack.url("lockserver"), "holder")
    # the longest lease: the revoke command's start-up (a Django process) on a loaded machine
    # must not outlast the grant's validity, or ensure_valid below fails by the clock alone
    with client.session(5_000) as session, session.lock(key, 60_000) as grant:
        result = _revoke(ops_stack, key, "--expected-token", str(grant.token - 1))
        assert result.returncode == 1
        assert json.loads(result.stdout)["code"] == "FENCED_OUT"
        grant.ensure_valid()
        assert client.info(key)["held"] is True
