"""The proxy as one more hop of C3 §3.8: what it answers when the role behind it fails.

Nothing reached the role (its socket gone) → 503 OVERLOADED, retrySafe: clients may fail
over. Forwarded and no answer in time → 504 UPSTREAM_TIMEOUT, forwarded and the answer cut →
502 UPSTREAM_FAILED, both retrySafe:false ("sent, outcome unknown"). Never re-sent upstream:
the request that timed out ran exactly once.
"""

from __future__ import annotations

import os
import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from devstack.common import wait_until

pytestmark = [pytest.mark.live, pytest.mark.slow]

ENVELOPE = {"code", "message", "retrySafe", "traceId"}


def sleeping(probe) -> int:
    return probe.sql(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND query LIKE 'SELECT pg_sleep%%' AND state = 'active'"
    )[0][0]


def gunicorn_worker(probe) -> int:
    def children(pid: int) -> list[int]:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]

    (master,) = [
        pid
        for pid in children(probe.process.pid)
        if b"gunicorn" in Path(f"/proc/{pid}/cmdline").read_bytes()
    ]
    (worker,) = children(master)
    return worker


def test_a_role_that_cannot_be_reached_is_503_overloaded_and_retry_safe(probe_factory):
    probe = probe_factory()
    sock = probe.role.socket_path
    moved = sock.with_name("moved.sock")
    os.rename(sock, moved)  # gunicorn is up, but nothing can connect to it
    try:
        # The proxy's idle upstream connections expire (UPSTREAM_KEEPALIVE_S); then a probe
        # shows nothing can be reached any more.
        wait_until(
            lambda: requests.get(f"{probe.url}/health/live", timeout=10).status_code == 503,
            timeout=60,
            what="the proxy's kept-alive upstream connections to expire",
            interval=5,  # longer than the proxy keeps an idle upstream connection
        )
        answer = requests.post(f"{probe.url}/probe/bump/1", json={"tag": "unreached"}, timeout=30)
    finally:
        os.rename(moved, sock)
    assert answer.status_code == 503, answer.text
    body = answer.json()
    assert set(body) == ENVELOPE | {"retryAfterMillis"}
    assert body["code"] == "OVERLOADED" and body["retrySafe"] is True
    assert body["retryAfterMillis"] > 0 and int(answer.headers["Retry-After"]) >= 1
    assert answer.headers["Content-Type"] == "application/json; charset=utf-8"
    assert probe.sql("SELECT count(*) FROM probe_log WHERE tag = 'unreached'") == [(0,)]
    assert requests.get(f"{probe.url}/health/live", timeout=30).status_code == 200


def test_a_forwarded_request_without_an_answer_in_time_is_504_and_never_resent(probe_factory):
    probe = probe_factory(PROXY_READ_TIMEOUT_MS="1000", DB_STATEMENT_TIMEOUT_MS="30000")
    trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    answer = requests.get(
        f"{probe.url}/probe/sleep",
        params={"ms": 4000},
        headers={"traceparent": f"00-{trace}-00f067aa0ba902b7-01"},
        timeout=30,
    )
    assert answer.status_code == 504, answer.text
    body = answer.json()
    assert set(body) == ENVELOPE
    assert body["code"] == "UPSTREAM_TIMEOUT" and body["retrySafe"] is False
    assert body["traceId"] == trace
    # The role still runs the one request it was given, and only that one: not re-sent.
    assert sleeping(probe) == 1
    wait_until(lambda: sleeping(probe) == 0, timeout=30, what="the sleep to end")


def test_a_forwarded_request_whose_answer_is_cut_is_502_upstream_failed(probe_factory):
    # The probe runs under the rail stub's settings, whose proxy passes drops through (below).
    probe = probe_factory(DB_STATEMENT_TIMEOUT_MS="30000", PROXY_PASS_DROPS="0")
    with ThreadPoolExecutor(1) as pool:
        slow = pool.submit(
            requests.get, f"{probe.url}/probe/sleep", params={"ms": 8000}, timeout=30
        )
        wait_until(lambda: sleeping(probe) == 1, timeout=30, what="the request in the role")
        os.kill(gunicorn_worker(probe), signal.SIGKILL)
        answer = slow.result()
    assert answer.status_code == 502, answer.text
    body = answer.json()
    assert set(body) == ENVELOPE
    assert body["code"] == "UPSTREAM_FAILED" and body["retrySafe"] is False
    # gunicorn's master starts a new worker; the proxy serves through it.
    wait_until(
        lambda: requests.get(f"{probe.url}/health/live", timeout=5).status_code == 200,
        timeout=60,
        what="a new worker",
    )


def test_the_proxy_budget_sits_between_each_role_and_its_callers():
    """proxy_read_timeout is above the role's own deadline; with the Kubernetes settings it is
    also below the read timeout of every dlock client calling the role (C3 §3.8)."""
    from devstack.proxy import caller_read_timeout_ms, read_timeout_ms, role_deadline_ms

    k8s = {"SERVER_QUEUE_DEADLINE_MS": "500", "DB_QUEUE_DEADLINE_MS": "500"}
    k8s["DB_STATEMENT_TIMEOUT_MS"] = "1500"
    for role in ("lockserver", "payments", "railproxy"):
        assert role_deadline_ms(role, k8s) < read_timeout_ms(role, k8s), role
        assert read_timeout_ms(role, k8s) < caller_read_timeout_ms(role, k8s), role
    # The rail stub is the third party: its proxy never cuts first, the rail-proxy's
    # RAIL_READ_TIMEOUT_MS does.
    assert read_timeout_ms("railstub", {}) > caller_read_timeout_ms("railstub", {})


def test_the_rail_stubs_proxy_passes_a_cut_answer_through_as_a_drop(probe_factory):
    """The third party hangs up: its caller sees the connection close, not a 502 (the rail
    stub's injected drops keep their meaning; tests/rail/test_rail_proxy.py::*drop*)."""
    probe = probe_factory(DB_STATEMENT_TIMEOUT_MS="30000")  # railstub: PROXY_PASS_DROPS=1
    with ThreadPoolExecutor(1) as pool:
        slow = pool.submit(
            requests.get, f"{probe.url}/probe/sleep", params={"ms": 8000}, timeout=30
        )
        wait_until(lambda: sleeping(probe) == 1, timeout=30, what="the request in the role")
        os.kill(gunicorn_worker(probe), signal.SIGKILL)
        with pytest.raises(requests.ConnectionError):
            slow.result()
