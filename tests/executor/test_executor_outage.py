"""Issue 27.2 and the proxy's 504 on the executor side, against real processes on loopback.

- A killed lock-server meets bounded, jittered back-off: one WARNING per outage episode, a
  counter per attempt, one "recovered" line; the attempt count is bounded by what the back-off
  schedule allows in the run's own elapsed time (read from its log), not by a wall-clock limit.
- A rail proxy whose own proxy answers 504 UPSTREAM_TIMEOUT: the submission is ambiguous exactly
  as a read timeout (never re-sent), and the event names the state the payout is in now.
"""

from __future__ import annotations

import logging
import os
import signal
from datetime import datetime

import pytest

from devstack.common import wait_until
from executor.backoff import OUTAGE_INITIAL_S, OUTAGE_MAX_S
from executor.worker import Executor
from tests.client.test_http_transport import ScriptedPeer, _json
from tests.executor.conftest import (
    account_ids,
    drain,
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


def _at(event: dict) -> float:
    return datetime.fromisoformat(event["ts"]).timestamp()


def _most_attempts(elapsed_s: float) -> int:
    """The most attempts the executor's outage back-off allows within `elapsed_s` between the
    first and the last: each wait is at least half its step (jitter 0.5–1×), steps doubling
    from OUTAGE_INITIAL_S up to OUTAGE_MAX_S."""
    attempts, waited = 1, 0.0
    while True:
        step = min(OUTAGE_MAX_S, OUTAGE_INITIAL_S * 2 ** (attempts - 1))
        if waited + 0.5 * step > elapsed_s:
            return attempts
        waited += 0.5 * step
        attempts += 1


def test_a_dead_lock_server_is_met_with_bounded_backoff_and_one_warning(exec_stack, tmp_path):
    seeded = seed(exec_stack, accounts=2, per_account=2, balance=100_000, amount=100)
    ids = payout_ids(seeded)
    replica = second_replica(exec_stack, "lockserver", tmp_path)
    os.killpg(os.getpgid(replica.process.pid), signal.SIGKILL)  # refused from now on
    replica.process.wait()
    proc = start_executor(
        exec_stack,
        _owner("exec-dead-lock"),
        "--until-idle",
        "--concurrency",
        "2",
        log_dir=tmp_path,
        env_overrides={"LOCK_SERVER_URL": replica.url},
    )
    # Let the outage run for a while: until the back-off has had to grow past a few steps.
    wait_until(
        lambda: len([e for e in proc.events("payout_executed") if e["outcome"] == "error"]) >= 6,
        timeout=120,
        what="six failed attempts",
    )
    replica.start()  # the lock-server is back: the executor recovers and drains
    assert proc.wait(120) == 0, proc.log.read_text()[-3000:]
    failed = [e for e in proc.events("payout_executed") if e["outcome"] == "error"]
    recovered = proc.events("executor_peer_recovered")
    assert len(recovered) == 1 and recovered[0]["peer"] == "lockserver"
    assert recovered[0]["failedAttempts"] == len(failed)
    elapsed = _at(failed[-1]) - _at(failed[0])
    # The first sections were in flight together before any failure was known (concurrency
    # 2); from then on one section at a time probes the dead peer, each after its back-off.
    assert len(failed) <= 1 + _most_attempts(elapsed), (len(failed), elapsed)
    warnings = [e for e in proc.events() if e.get("level") == "WARNING"]
    lock_failed = [e for e in warnings if e["event"] == "executor_lock_failed"]
    assert len(lock_failed) == 1 and lock_failed[0]["outage"] == "started"
    # Besides that one: at most the client's one demotion line for the dead endpoint.
    assert {e["event"] for e in warnings} <= {"executor_lock_failed", "client_endpoint_demoted"}
    assert len(warnings) <= 2, [e["event"] for e in warnings]
    assert set(states(exec_stack, ids).values()) == {"POSTED"}
    assert set(rail_requests(exec_stack, ids).values()) == {1}
    replica.stop()
    assert account_ids(seeded)


UPSTREAM_TIMEOUT = (
    b'{"code":"UPSTREAM_TIMEOUT","message":"upstream timed out","retrySafe":false,'
    b'"details":{},"traceId":"nginx-1"}'
)


def test_an_upstream_timeout_of_the_rail_proxy_is_ambiguous_and_never_resent(
    exec_stack, tmp_path, caplog
):
    seeded = seed(exec_stack, accounts=1, per_account=1, balance=5_000, amount=1_000)
    (pid,) = payout_ids(seeded)
    # The rail proxy's nginx, as it answers when the proxy behind it did not answer in time.
    nginx = ScriptedPeer(
        lambda n, request: (
            _json(200, b'{"status":"ok"}')
            if request.startswith(b"GET /health")
            else _json(504, UPSTREAM_TIMEOUT)
        )
    )
    try:
        executor = Executor(
            owner_id=_owner("exec-504"),
            lock_url=exec_stack.env["LOCK_SERVER_URL"],
            payments_url=exec_stack.env["PAYMENTS_URL"],
            rail_proxy_url=nginx.url,
        )
        with caplog.at_level(logging.INFO, logger="dlock.events"):
            assert executor.run(max_payouts=1) == 0
    finally:
        nginx.close()
    submissions = [r for r in nginx.requests if r.startswith(b"POST /v1/rail/submissions")]
    assert len(submissions) == 1  # presented once, never again
    events = {r.__dict__.get("event"): r.__dict__ for r in caplog.records}
    ambiguous = events["rail_ambiguous"]
    assert ambiguous["payoutId"] == pid
    assert ambiguous["details"] == {"reason": "executor upstream timeout"}
    # The state it is in now: the fake proxy never recorded an intent, so P4 says CLAIMED (a
    # real proxy behind a timed-out nginx would have it SUBMITTING or RAIL_AMBIGUOUS).
    assert ambiguous["state"] == states(exec_stack, [pid])[pid] == "CLAIMED"
    assert executor.outcomes == {"ambiguous": 1}
    # Nothing reached a rail, so the next holder recovers it through the real proxy, once.
    drain(exec_stack, tmp_path, _owner("exec-504-drain"))
    assert states(exec_stack, [pid]) == {pid: "POSTED"}
    assert rail_requests(exec_stack, [pid]) == {pid: 1}
