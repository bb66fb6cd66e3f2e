"""Issue 27.1 against real processes: two lock-server replicas on one lockdb, the client's first
one frozen with SIGSTOP (a GC pause, CPU starvation, a stuck disk). The call in flight to it ends
"sent, outcome unknown" and is not re-sent; the next calls go to the other replica; after SIGCONT
the frozen one is probed back. Causal checks only: no wall-clock bound.
"""

from __future__ import annotations

import logging
import os
import signal
import uuid

import pytest

from devstack.common import wait_until
from dlock.client import LockClient, ServiceUnreachable
from tests.executor.conftest import owner_id, second_replica

pytestmark = [pytest.mark.live, pytest.mark.slow]


def test_a_stalled_replica_is_routed_around_and_probed_back(exec_stack, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="dlock.events")
    replica = second_replica(exec_stack, "lockserver", tmp_path)
    other = exec_stack.url("lockserver")
    client = LockClient(f"{replica.url},{other}", owner_id("stall"))
    key = f"test:stall:{uuid.uuid4().hex[:8]}"
    group = os.getpgid(replica.process.pid)  # gunicorn's master and its workers
    with client.session(ttl_ms=6_000) as session:
        first = session.acquire(key, 3_000)
        assert client.base_url == replica.url  # the first of the list while it answers
        first.release()
        os.killpg(group, signal.SIGSTOP)
        try:
            # In flight to the frozen replica: its bytes left, no answer comes. Unknown outcome,
            # so not re-sent to the other replica (the lease and the fence cover a lock call).
            with pytest.raises(ServiceUnreachable) as caught:
                session.acquire(f"{key}:inflight", 3_000)
            assert caught.value.sent is True
            assert replica.url in client.endpoints.demoted()
            # The next calls go to the other replica: each would time out on the frozen one.
            tokens = []
            for _ in range(3):
                grant = session.acquire(key, 3_000)
                tokens.append(grant.token)
                assert grant.release() is True
            assert tokens == sorted(tokens) and tokens[0] > first.token
            assert client.base_url == other
            assert session.lost is None  # heartbeats moved on by themselves
        finally:
            os.killpg(group, signal.SIGCONT)

        # Thawed: once its demotion period is over, one trial call goes to it and restores it
        # (or a call that was already out to it, a heartbeat say, is answered now).
        def probed_back() -> bool:
            session.acquire(key, 3_000).release()
            return not client.endpoints.demoted()

        wait_until(probed_back, timeout=60, what="the thawed replica to be probed back")
    events = [r.getMessage() for r in caplog.records]
    assert "client_endpoint_demoted" in events and "client_endpoint_restored" in events
    # Restored means used again: with the other replica gone, calls go to the thawed one.
    exec_stack.procs["lockserver"].stop()
    try:
        with client.session(ttl_ms=6_000) as again:
            again.acquire(key, 3_000).release()
        assert client.base_url == replica.url
    finally:
        exec_stack.procs["lockserver"].start()
        replica.stop()
