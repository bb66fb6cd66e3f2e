"""SIGTERM and SIGINT drain: the listener closes at once, the request in flight completes."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from devstack.common import wait_until

pytestmark = [pytest.mark.live, pytest.mark.slow]


def sleeping_in_the_database(probe) -> bool:
    rows = probe.sql(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND query LIKE 'SELECT pg_sleep%%' AND state = 'active'"
    )
    return rows[0][0] == 1


def connection_refused(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        try:
            sock.connect(("127.0.0.1", port))
        except ConnectionRefusedError:
            return True
        return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_request_in_flight_completes_while_new_connections_are_refused(probe_factory, sig):
    probe = probe_factory(DB_STATEMENT_TIMEOUT_MS="30000", GUNICORN_GRACEFUL_TIMEOUT="30")
    with ThreadPoolExecutor(1) as pool:
        slow = pool.submit(
            requests.get, f"{probe.url}/probe/sleep", params={"ms": 2500}, timeout=30
        )
        wait_until(lambda: sleeping_in_the_database(probe), timeout=20, what="slow request")
        probe.process.send_signal(sig)
        wait_until(lambda: connection_refused(probe.port), timeout=10, what="listener closed")
        refused_while_draining = not slow.done()
        response = slow.result()
    assert refused_while_draining
    assert response.status_code == 200 and response.json() == {"slept": 2500}
    assert probe.process.wait(30) == 0
    assert "Traceback" not in probe.log()
    # One JSON line each at start, at the drain and at the stop, in that order (issue 24.6).
    events = [json.loads(line) for line in probe.log().splitlines() if line.startswith("{")]
    lifecycle = [e for e in events if e.get("event", "").startswith("service_")]
    assert [e["event"] for e in lifecycle] == [
        "service_started",
        "service_draining",
        "service_stopped",
    ]
    started = lifecycle[0]
    assert started["role"] == "railstub" and started["service"] == "rail-stub"
    assert started["listen"] == [str(probe.role.socket_path)]
    assert started["publicAddress"] == f"127.0.0.1:{probe.port}"
    assert started["workers"] == 1 and started["threads"] == 64 and started["version"]


def test_a_request_still_running_at_the_graceful_timeout_is_cut_and_the_process_exits(
    probe_factory,
):
    probe = probe_factory(DB_STATEMENT_TIMEOUT_MS="60000", GUNICORN_GRACEFUL_TIMEOUT="1")
    with ThreadPoolExecutor(1) as pool:
        slow = pool.submit(
            requests.get, f"{probe.url}/probe/sleep", params={"ms": 20000}, timeout=30
        )
        wait_until(lambda: sleeping_in_the_database(probe), timeout=20, what="slow request")
        probe.process.send_signal(signal.SIGTERM)
        try:
            exit_code = probe.process.wait(15)
        except subprocess.TimeoutExpired:
            pytest.fail("gunicorn did not exit after its graceful timeout")
        with pytest.raises(requests.ConnectionError):
            slow.result()
    assert exit_code == 0
    # The server cancels the abandoned statement when its connection goes away.
    wait_until(lambda: not sleeping_in_the_database(probe), timeout=20, what="statement gone")
