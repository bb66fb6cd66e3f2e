"""Caller credentials on every /v1 endpoint (issue 15 item 1, ARCHITECTURE decision 14)."""

from __future__ import annotations

import uuid

import pytest
import requests

from dlock.auth import credentials_entry, new_credential
from tests import credentials
from tests.payments.test_live import _seed

pytestmark = pytest.mark.live

NONE = {"Authorization": None}
UNKNOWN = {"Authorization": f"Bearer {new_credential()}"}
OPERATOR = {"Authorization": f"Bearer {credentials.OPERATOR}"}
EXECUTOR = {"Authorization": f"Bearer {credentials.EXECUTOR}"}
# A second executor, valid at the same time (rotation), for the session-ownership cases.
OTHER = new_credential()


@pytest.fixture(scope="module")
def stack():
    from tests.conftest import start_stack, stop_stack

    entries = f"{credentials.CREDENTIALS},{credentials_entry(OTHER, 'executor')}"
    started = start_stack("creds", {"DLOCK_CREDENTIALS": entries})
    yield started
    stop_stack(started)


def _endpoints(stack) -> list[tuple[str, str, str]]:
    lock, pay, rail = (stack.url(r) for r in ("lockserver", "payments", "railproxy"))
    sid, pid = uuid.uuid4(), uuid.uuid4()
    return [
        ("POST", f"{lock}/v1/sessions", "executor"),
        ("POST", f"{lock}/v1/sessions/{sid}/heartbeat", "executor"),
        ("DELETE", f"{lock}/v1/sessions/{sid}", "executor"),
        ("POST", f"{lock}/v1/locks/k1/acquire", "executor"),
        ("POST", f"{lock}/v1/locks/k1/renew", "executor"),
        ("DELETE", f"{lock}/v1/locks/k1?sessionId={sid}", "executor"),
        ("GET", f"{lock}/v1/locks/k1", "executor"),
        ("POST", f"{lock}/v1/locks/k1/revoke", "operator"),
        ("GET", f"{pay}/v1/payouts", "executor|operator"),
        ("POST", f"{pay}/v1/payouts/{pid}/claim", "executor"),
        ("POST", f"{pay}/v1/payouts/{pid}/post", "executor"),
        ("GET", f"{pay}/v1/payouts/{pid}", "executor|operator"),
        ("GET", f"{pay}/v1/accounts/a1", "executor"),
        ("POST", f"{rail}/v1/rail/submissions", "executor"),
    ]


def test_every_v1_endpoint_refuses_a_missing_or_unknown_credential_with_401(stack):
    for method, url, _ in _endpoints(stack):
        for headers in (NONE, UNKNOWN, {"Authorization": "Basic !!notbase64"}):
            answer = requests.request(method, url, json={}, headers=headers, timeout=10)
            assert answer.status_code == 401, (method, url, answer.text)
            body = answer.json()
            assert body["code"] == "UNAUTHENTICATED" and body["retrySafe"] is False
            assert "Bearer" in answer.headers["WWW-Authenticate"]


def test_every_v1_endpoint_refuses_the_wrong_scope_with_403(stack):
    for method, url, scope in _endpoints(stack):
        if scope == "executor|operator":
            continue  # both scopes may call it: below
        wrong = EXECUTOR if scope == "operator" else OPERATOR
        answer = requests.request(method, url, json={}, headers=wrong, timeout=10)
        assert answer.status_code == 403, (method, url, answer.text)
        assert answer.json()["code"] == "FORBIDDEN" and answer.json()["retrySafe"] is False


def test_the_payout_reads_answer_both_scopes_through_the_real_server(stack):
    reads = [(m, u) for m, u, scope in _endpoints(stack) if scope == "executor|operator"]
    assert len(reads) == 2
    for method, url in reads:
        for headers in (EXECUTOR, OPERATOR):
            answer = requests.request(method, url, headers=headers, timeout=10)
            # the list answers 200, an unknown payout 404: judged by the view, not refused
            assert answer.status_code in (200, 404), (method, url, answer.text)
            assert answer.status_code == 200 or answer.json()["code"] == "NOT_FOUND"


def test_revoke_with_an_unauthenticated_caller_changes_nothing(stack):
    lock = stack.url("lockserver")
    body = {"operator": "nobody", "reason": "no credential at all"}
    refused = requests.post(f"{lock}/v1/locks/anything/revoke", json=body, headers=NONE, timeout=10)
    assert refused.status_code == 401
    allowed = requests.post(
        f"{lock}/v1/locks/anything/revoke", json=body, headers=OPERATOR, timeout=10
    )
    assert allowed.status_code in (200, 404), allowed.text  # judged by L8 itself now


def test_health_metrics_schema_and_docs_stay_open(stack):
    for role in ("lockserver", "payments", "railproxy"):
        for path in ("/health/live", "/health/ready", "/metrics", "/v1/schema", "/v1/docs"):
            answer = requests.get(f"{stack.url(role)}{path}", headers=NONE, timeout=10)
            assert answer.status_code == 200, (role, path)
    # the lock server's public fencing keys carry no secret (decision 25): open too
    keys = requests.get(f"{stack.url('lockserver')}/v1/fencing-keys", headers=NONE, timeout=10)
    assert keys.status_code == 200 and keys.json()["keys"], keys.text


def test_the_browsable_api_answers_a_browser_with_basic_auth(stack):
    url = f"{stack.url('payments')}/v1/payouts"
    html = {"Accept": "text/html"}
    challenged = requests.get(url, headers={**html, **NONE}, timeout=10)
    assert challenged.status_code == 401 and "Basic" in challenged.headers["WWW-Authenticate"]
    page = requests.get(
        url, headers={**html, **NONE}, auth=("anyone", credentials.EXECUTOR), timeout=10
    )
    assert page.status_code == 200 and page.headers["Content-Type"].startswith("text/html")


def _session(lock: str, credential: str) -> str:
    opened = requests.post(
        f"{lock}/v1/sessions",
        json={"ownerId": "owner-a", "ttlMillis": 10_000},
        headers={"Authorization": f"Bearer {credential}"},
        timeout=10,
    )
    assert opened.status_code == 201, opened.text
    return opened.json()["sessionId"]


def test_a_session_belongs_to_the_credential_that_opened_it(stack):
    lock = stack.url("lockserver")
    theirs = {"Authorization": f"Bearer {OTHER}", "X-Owner-Id": "owner-a"}
    mine = {**EXECUTOR, "X-Owner-Id": "owner-a"}
    sid = _session(lock, credentials.EXECUTOR)
    key = f"own-{uuid.uuid4().hex[:8]}"
    grant = requests.post(
        f"{lock}/v1/locks/{key}/acquire", json={"sessionId": sid}, headers=mine, timeout=10
    )
    assert grant.status_code == 200
    token = str(grant.json()["fencingToken"])
    # Even with the grant's genuine proof, another credential's L5/L6 is refused.
    fence = {"X-Fencing-Token": token, "X-Fencing-Proof": grant.json()["fencingProof"]}
    attempts = [
        ("POST", f"{lock}/v1/sessions/{sid}/heartbeat", {}),
        ("POST", f"{lock}/v1/locks/{key}/acquire", {"sessionId": sid}),
        ("POST", f"{lock}/v1/locks/{key}/renew", {"sessionId": sid}),
        ("DELETE", f"{lock}/v1/locks/{key}?sessionId={sid}", None),
        ("DELETE", f"{lock}/v1/sessions/{sid}", None),
    ]
    for method, url, body in attempts:
        answer = requests.request(method, url, json=body, headers={**theirs, **fence}, timeout=10)
        assert answer.status_code == 403, (method, url, answer.text)
        assert answer.json()["code"] == "FORBIDDEN"
    still = requests.get(f"{lock}/v1/locks/{key}", headers=mine, timeout=10).json()
    assert still["held"] is True and still["fencingToken"] == int(token)
    beat = requests.post(f"{lock}/v1/sessions/{sid}/heartbeat", headers=mine, timeout=10)
    assert beat.status_code == 200
    released = requests.delete(
        f"{lock}/v1/locks/{key}",
        params={"sessionId": sid},
        headers={**mine, **fence},
        timeout=10,
    )
    assert released.status_code == 204


def test_a_claim_without_a_credential_writes_nothing(stack):
    pay = stack.url("payments")
    payout = _seed(stack, payouts=1)["payouts"][0]
    answer = requests.post(
        f"{pay}/v1/payouts/{payout}/claim",
        json={"expectedState": "PENDING"},
        headers={
            **NONE,
            "X-Fencing-Token": str(2**63 - 1),
            "X-Owner-Id": "intruder",
            "X-Idempotency-Key": f"payout-{payout}",
        },
        timeout=10,
    )
    assert answer.status_code == 401
    after = requests.get(f"{pay}/v1/payouts/{payout}", timeout=10).json()
    assert after["state"] == "PENDING"
    account = requests.get(f"{pay}/v1/accounts/{after['accountId']}", timeout=10).json()
    assert account.get("fence") in (0, None)
