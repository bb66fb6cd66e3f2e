"""Each role as a real gunicorn process: JSON 404s, readiness, metrics, and the ROLE guard."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import requests

from devstack.common import PROJECT, free_port
from devstack.roles import RoleProcess
from tests.conftest import ROLES, migrated_live_databases, raw_request

pytestmark = pytest.mark.live


@pytest.mark.parametrize("role", ROLES)
def test_unknown_path_on_every_role_is_a_json_404_with_trace_id(live_stack, role):
    response = requests.get(f"{live_stack.url(role)}/definitely/not/here", timeout=5)
    assert response.status_code == 404
    assert response.headers["Content-Type"] == "application/json; charset=utf-8"
    body = response.json()
    assert body["code"] == "NOT_FOUND" and len(body["traceId"]) == 32


@pytest.mark.parametrize("role", ROLES)
def test_every_role_is_live_and_ready(live_stack, role):
    assert requests.get(f"{live_stack.url(role)}/health/live", timeout=5).status_code == 200
    assert requests.get(f"{live_stack.url(role)}/health/ready", timeout=5).status_code == 200


@pytest.mark.parametrize("role", ROLES)
def test_wrong_method_and_bad_json_are_envelopes_on_every_role(live_stack, role):
    response = requests.delete(f"{live_stack.url(role)}/health/live", timeout=5)
    assert response.status_code == 405
    assert response.json()["code"] == "VALIDATION_FAILED"


def _raw_exchange(url: str, request: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = raw_request(int(url.rsplit(":", 1)[1]), request).partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    return int(lines[0].split()[1]), headers, body


_V1_WRITE = {
    "lockserver": b"/v1/locks/k/acquire",
    "payments": b"/v1/payouts/00000000-0000-4000-8000-000000000000/claim",
    "railproxy": b"/v1/rail/submissions",
    "railstub": b"/submit",
}


@pytest.mark.parametrize("role", ROLES)
def test_a_machine_call_with_a_host_outside_allowed_hosts_is_400_before_any_view(live_stack, role):
    # ALLOWED_HOSTS is CommonMiddleware's check, in every role's list: the write is refused
    # before its view (not 401/404/200).
    def send(host: bytes) -> tuple[int, dict[str, str], bytes]:
        return _raw_exchange(
            live_stack.url(role),
            b"POST " + _V1_WRITE[role] + b" HTTP/1.1\r\nHost: " + host + b"\r\n"
            b"Content-Type: application/json\r\nContent-Length: 2\r\nConnection: close"
            b"\r\n\r\n{}",
        )

    status, headers, body = send(b"evil.example")
    assert status == 400, body
    assert headers["content-type"] == "application/json; charset=utf-8"
    assert json.loads(body)["code"] == "VALIDATION_FAILED"
    # With an allowed Host the same request reaches the role's own checks (a missing
    # credential or header, the stub's body validation): another answer.
    own_status, _, own_body = send(b"127.0.0.1")
    assert (
        own_status in (400, 401) and json.loads(own_body)["message"] != json.loads(body)["message"]
    )


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"GARBAGE\r\n\r\n", 400),
        (b"GET /v1/" + b"a" * 5000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414),
        (b"GET /health/live HTTP/1.1\r\nHost: x\r\nX-Owner-Id: " + b"o" * 9000 + b"\r\n\r\n", 431),
    ],
    ids=["bad-request-line", "uri-too-long", "header-too-large"],
)
def test_requests_refused_by_the_http_parser_still_get_the_envelope(
    live_stack, role, request_bytes, status
):
    """gunicorn answers these itself (Django never sees them): JSON, never its HTML page."""
    got, headers, body = _raw_exchange(live_stack.url(role), request_bytes)
    assert got == status
    assert headers["content-type"] == "application/json; charset=utf-8"
    assert int(headers["content-length"]) == len(body)
    envelope = json.loads(body)
    assert envelope["code"] == "VALIDATION_FAILED" and envelope["retrySafe"] is False
    assert envelope["details"]["fields"][0]["field"] == "request"
    assert re.fullmatch(r"[0-9a-f]{32}", envelope["traceId"])


# Each role's own domain series, at 0 from start-up; everything else is another role's.
OWN_SERIES = {
    "lockserver": [
        'lock_acquire_total{backend="pg",outcome="granted"} 0.0',
        'lock_acquire_total{backend="pg",outcome="not_leader"} 0.0',
        'lock_live_sessions{backend="pg"}',
        "dlock_requests_shed_total 0.0",
    ],
    "payments": [
        'lock_fenced_out_total{resource="account"} 0.0',
        'lock_fenced_out_total{resource="ledger"} 0.0',
        'payouts_in_state{state="RAIL_AMBIGUOUS"} 0.0',
        'payouts_in_state{state="PENDING"} 0.0',
        "dlock_requests_shed_total 0.0",
        # the books, read from paydb at scrape (payments/books_metrics.py)
        "rail_recoveries_open 0.0",
        'payout_backlog_oldest_age_seconds{state="PENDING"}',
    ],
    "railproxy": [
        'lock_fenced_out_total{resource="rail"} 0.0',
        "rail_duplicate_attempted_total 0.0",
        'rail_submission_total{outcome="acked"} 0.0',
        "dlock_requests_shed_total 0.0",
    ],
    "railstub": ["dlock_requests_shed_total 0.0"],
}
FOREIGN_SERIES = {
    "lockserver": ["lock_fenced_out", "rail_", "payout_", "payouts_in_state", 'backend="etcd"'],
    "payments": [
        'resource="rail"',
        "rail_submission",
        "rail_duplicate",
        "payout_execute",
        "payout_backlog_age_seconds",
        "lock_acquire",
    ],
    "railproxy": ['resource="account"', 'resource="ledger"', "payout_", "payouts_in", "lock_acq"],
    "railstub": ["lock_", "rail_", "payout_", "payouts_in_state"],
}


@pytest.fixture(scope="module")
def empty_env(live_stack):
    """The live stack's settings over fresh, empty databases (payouts_in_state reads paydb)."""
    return {**live_stack.env, **migrated_live_databases("metrics")}


def _is(line: str, foreign: str) -> bool:
    return foreign in line if "=" in foreign else line.startswith(foreign)


@pytest.mark.parametrize("role", ROLES)
def test_each_role_exports_only_its_own_domain_series_at_zero_from_start_up(
    empty_env, role, tmp_path
):
    # A fresh process: the shared stack's counters have seen other tests' work.
    env = empty_env
    proc = RoleProcess(role, free_port(), env, tmp_path / f"{role}.log").start()
    try:
        text = requests.get(f"{proc.url}/metrics", timeout=5).text
    finally:
        proc.stop()
    for series in OWN_SERIES[role]:
        assert series in text, series
    samples = [line for line in text.splitlines() if line and not line.startswith("#")]
    for foreign in FOREIGN_SERIES[role]:
        assert not [line for line in samples if _is(line, foreign)], foreign
    # Process and request metrics are every role's.
    assert "process_cpu_seconds_total" in text
    assert "django_http_requests_before_middlewares_total" in text


def test_readiness_and_requests_fail_closed_when_the_database_is_unreachable(tmp_path):
    dead = f"postgres://postgres@127.0.0.1:{free_port()}/paydb"
    env = {
        "PAY_DATABASE_URL": dead,
        "DJANGO_SECRET_KEY": os.environ["DJANGO_SECRET_KEY"],
        "DB_QUEUE_DEADLINE_MS": "300",
    }
    proc = RoleProcess("payments", free_port(), env, tmp_path / "payments.log")
    proc.start(wait=False)
    try:
        from devstack.common import wait_until

        wait_until(lambda: _answers(proc.url), timeout=30, what="payments listening")
        live = requests.get(f"{proc.url}/health/live", timeout=5)
        ready = requests.get(f"{proc.url}/health/ready", timeout=10)
        assert live.status_code == 200
        assert ready.status_code == 503
        body = ready.json()
        assert body["code"] == "NOT_LEADER" and body["retrySafe"] is True
        assert body["details"]["checks"] == {"paydb": "DOWN"}
        # A data request is an outage too (NOT_LEADER), not load (OVERLOADED), although the
        # pool can only say that no slot came within the queue deadline.
        for _ in range(2):
            answer = requests.get(f"{proc.url}/v1/payouts", timeout=10)
            assert answer.status_code == 503
            assert answer.json()["code"] == "NOT_LEADER" and answer.json()["retryAfterMillis"] > 0
    finally:
        proc.stop()


def _answers(url: str) -> bool:
    """The role itself answers (its proxy answers 503 until gunicorn listens behind it)."""
    try:
        return requests.get(f"{url}/health/live", timeout=1).status_code == 200
    except requests.RequestException:
        return False


@pytest.mark.parametrize("role", ["", "bogus"])
def test_missing_or_unknown_role_stops_start_up_with_one_clear_line(role):
    env = {**os.environ, "ROLE": role}
    result = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=PROJECT, env=env, capture_output=True, text=True
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "lockserver, payments, railproxy, railstub, admin, executor, ops" in lines[0]


def test_production_start_up_refuses_a_missing_secret():
    env = {**os.environ, "ROLE": "railstub", "DJANGO_DEBUG": "false", "DJANGO_SECRET_KEY": ""}
    result = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=PROJECT, env=env, capture_output=True, text=True
    )
    assert result.returncode != 0
    assert "DJANGO_SECRET_KEY" in result.stderr
