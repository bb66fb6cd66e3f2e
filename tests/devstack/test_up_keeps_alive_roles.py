"""`make up` never replaces a role that is alive (answers /health/live) because it is not ready
(issue 27 item 3): it waits for it, and when it stays unready, fails naming it and its checks —
the process is left running. A real lock-server on a private etcd that is stopped (alive, not
ready) and started again."""

from __future__ import annotations

import threading
import time

import pytest

from devstack.common import StackError
from devstack.liveness import plan, wait_alive
from tests.conftest import fresh_etcd
from tests.lockserver.conftest import start_lock_server

pytestmark = [pytest.mark.etcd, pytest.mark.live]


@pytest.fixture
def own_etcd():
    server = fresh_etcd()
    yield server
    server.stop()


def test_an_alive_role_that_is_not_ready_is_waited_for_and_never_replaced(own_etcd, tmp_path):
    server = start_lock_server("etcd", {"ETCD_URL": own_etcd.url})
    try:
        port, pid = server.proc.port, server.proc.process.pid
        running = {"lockserver": {"pid": pid}}
        assert plan("lockserver", port, running) == "ready"
        assert plan("lockserver", port, {}) == "start"

        own_etcd.stop()  # the lock-server still answers /health/live; readiness is 503
        assert server.get("/health/ready").status_code == 503
        assert plan("lockserver", port, running) == "alive"

        # Still unready after the wait: up fails, names it and what it waits for, kills nothing.
        with pytest.raises(StackError) as failed:
            wait_alive([("lockserver", port)], tmp_path, timeout=1)
        assert "alive (answers /health/live) but not ready" in str(failed.value)
        assert "lockBackend=DOWN" in str(failed.value)
        assert server.proc.process.poll() is None

        # Its dependency comes back while up waits: up carries on with the same process.
        threading.Timer(1.0, own_etcd.start).start()
        started = time.monotonic()
        wait_alive([("lockserver", port)], tmp_path, timeout=60)
        assert time.monotonic() - started > 0.5  # it did wait (causally: etcd was down)
        assert server.proc.process.pid == pid and server.proc.process.poll() is None
        assert plan("lockserver", port, running) == "ready"
    finally:
        server.stop()


def test_a_process_that_answers_nothing_is_replaced(tmp_path):
    # A recorded pid that is alive but serves no HTTP on the port (here: this test process).
    import os

    from devstack.common import free_port

    assert plan("lockserver", free_port(), {"lockserver": {"pid": os.getpid()}}) == "replace"
