"""Hardening under the real server: headers, limits, the monitoring port, start-up refusals."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import requests

from devstack.common import PROJECT, free_port
from dlock import proof
from tests.conftest import raw_request

pytestmark = pytest.mark.live


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    from tests.production.conftest import start_probe

    metrics_port = free_port()
    started = start_probe(tmp_path_factory.mktemp("hardening"), METRICS_PORT=str(metrics_port))
    started.metrics_port = metrics_port
    yield started
    started.stop()


def test_json_answers_carry_the_security_headers_errors_included(probe):
    for path in ("/health/live", "/no/such/route"):
        response = requests.get(f"{probe.url}{path}", timeout=5)
        assert response.headers["X-Content-Type-Options"] == "nosniff"
        assert response.headers["X-Frame-Options"] == "DENY"
        assert response.headers["Cache-Control"] == "no-store"
        assert "default-src 'none'" in response.headers["Content-Security-Policy"]
        assert response.headers["Referrer-Policy"] == "same-origin"


def test_the_browsable_api_answers_a_browser_on_get_and_errors_stay_json(probe):
    html = {"Accept": "text/html"}
    page = requests.get(f"{probe.url}/probe/sleep", params={"ms": 0}, headers=html, timeout=5)
    assert page.status_code == 200 and page.headers["Content-Type"].startswith("text/html")
    assert "rest_framework" in page.text and "slept" in page.text
    error = requests.get(f"{probe.url}/no/such/route", headers=html, timeout=5)
    assert error.status_code == 404
    assert error.headers["Content-Type"] == "application/json; charset=utf-8"
    write = requests.post(f"{probe.url}/probe/bump/3", json={"tag": "x"}, headers=html, timeout=5)
    assert write.headers["Content-Type"] == "application/json; charset=utf-8"
    plain = requests.get(f"{probe.url}/probe/sleep", params={"ms": 0}, timeout=5)
    assert plain.headers["Content-Type"] == "application/json; charset=utf-8"


def test_the_docs_and_their_assets_are_served_locally(probe):
    schema = requests.get(f"{probe.url}/v1/schema", timeout=10)
    assert schema.status_code == 200 and schema.json()["openapi"].startswith("3.")
    for page in ("/v1/docs", "/v1/redoc"):
        body = requests.get(f"{probe.url}{page}", timeout=5).text
        assert "cdn" not in body.lower() and "/static/drf_spectacular_sidecar/" in body
    asset = requests.get(
        f"{probe.url}/static/drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js",
        timeout=10,
    )
    assert asset.status_code == 200 and "javascript" in asset.headers["Content-Type"]
    for sneaky in ("/static/../settings/base.py", "/static/dlock/errors.py"):
        assert requests.get(f"{probe.url}{sneaky}", timeout=5).status_code == 404


def test_the_monitoring_port_answers_metrics_and_health_only(probe):
    metrics = f"http://127.0.0.1:{probe.metrics_port}"
    assert requests.get(f"{metrics}/metrics", timeout=5).status_code == 200
    assert requests.get(f"{metrics}/health/ready", timeout=5).status_code == 200
    api = requests.get(f"{metrics}/probe/sleep", params={"ms": 0}, timeout=5)
    assert api.status_code == 404 and api.json()["code"] == "NOT_FOUND"
    # The Host header can't talk its way past the guard: the socket decides.
    spoofed = requests.get(
        f"{metrics}/v1/schema", headers={"Host": f"127.0.0.1:{probe.port}"}, timeout=5
    )
    assert spoofed.status_code == 404
    assert requests.get(f"{probe.url}/probe/sleep", params={"ms": 0}, timeout=5).ok


@pytest.mark.parametrize(
    "header",
    [
        b"X-Owner-Id: a\rb\r\n",  # bare CR inside a value
        b"X-Owner-Id: " + b"a" * 5000 + b"\r\n",  # over the proxy's 4 KiB header line
        b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 1000) for i in range(20)),  # head over 16 KiB
    ],
    ids=["cr-in-value", "huge-value", "head-too-large"],
)
def test_malformed_or_oversized_headers_are_refused_before_the_app(probe, header):
    answer = raw_request(
        probe.port, b"GET /health/live HTTP/1.1\r\nHost: 127.0.0.1\r\n" + header + b"\r\n"
    )
    status = int(answer.split(b" ", 2)[1])
    assert 400 <= status < 500


def test_an_overlong_request_line_is_refused(probe):
    answer = raw_request(probe.port, b"GET /" + b"a" * 5000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    assert 400 <= int(answer.split(b" ", 2)[1]) < 500


def test_production_refuses_debug_at_start_up():
    env = {
        **os.environ,
        "ROLE": "railstub",
        "DJANGO_DEBUG": "true",
        "DLOCK_ENVIRONMENT": "production",
    }
    result = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=PROJECT, env=env, capture_output=True, text=True
    )
    assert result.returncode != 0 and "DJANGO_DEBUG=true is refused" in result.stderr


def test_logs_never_carry_beneficiary_data_bodies_or_the_secret_key(live_stack):
    import uuid

    marker = f"BENEFICIARY-{uuid.uuid4().hex}"
    body = {
        "payoutId": str(uuid.uuid4()),
        "accountId": f"acct-{uuid.uuid4().hex[:8]}",
        "amountMinor": 1234,
        "currency": "EUR",
        "beneficiaryRef": marker,
    }
    headers = {
        "X-Fencing-Token": "7",
        "X-Fencing-Proof": proof.sign(key=proof.payout_key(body["accountId"]), token=7),
        "X-Owner-Id": "log-probe",
        "X-Idempotency-Key": f"payout-{body['payoutId']}",
    }
    requests.post(
        f"{live_stack.url('railproxy')}/v1/rail/submissions", json=body, headers=headers, timeout=15
    )
    requests.post(  # malformed on purpose: the error path must not echo the body either
        f"{live_stack.url('railproxy')}/v1/rail/submissions",
        data=f'{{"beneficiaryRef": "{marker}", "x": NaN}}',
        headers={**headers, "Content-Type": "application/json"},
        timeout=15,
    )
    logs = "".join(p.read_text(errors="replace") for p in live_stack.logdir.glob("*.log"))
    assert marker not in logs
    assert live_stack.env["DJANGO_SECRET_KEY"] not in logs
    for url in (v for k, v in live_stack.env.items() if k.endswith("_DATABASE_URL")):
        assert url not in logs
