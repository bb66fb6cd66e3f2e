"""Request and database metrics from django-prometheus, on the real servers (gunicorn, live
stack): its middlewares count the hot /v1 calls, its engine
and dlock's server-binding cursors count the statements, and no id a request carries (payout,
account, session, lock key, idempotency key, query string) becomes a label value."""

from __future__ import annotations

import re
import uuid

import pytest
import requests

from dlock.client import LockClient

pytestmark = pytest.mark.live

SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})? (?P<value>\S+)$")
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def _samples(url: str) -> dict[tuple[str, frozenset], float]:
    text = requests.get(f"{url}/metrics", timeout=5).text
    out = {}
    for line in text.splitlines():
        match = SAMPLE.match(line)
        if match and not line.startswith("#"):
            labels = frozenset(LABEL.findall(match["labels"] or ""))
            out[(match["name"], labels)] = float(match["value"])
    return out


def _value(samples: dict, name: str, **labels: str) -> float:
    """The sum over every series of `name` whose labels include `labels`."""
    wanted = set(labels.items())
    return sum(v for (n, have), v in samples.items() if n == name and wanted <= have)


def test_a_hot_call_is_counted_by_view_name_and_its_statements_by_alias(live_stack):
    # lock-server L4 and L6 are plain Django views (no DRF, no page middleware) and run their
    # SQL through the pooled server-binding cursor (lockserver.backends.pg).
    url = live_stack.url("lockserver")
    key = f"payout:metrics-{uuid.uuid4().hex}"
    before = _samples(url)

    client = LockClient(url, "metrics-owner")
    with client.session(heartbeat=False) as session, session.lock(key):
        pass

    after = _samples(url)
    acquired = {"view": "lock-acquire", "method": "POST"}
    released = {"view": "lock", "method": "DELETE"}
    for labels in (acquired, released):
        name = "django_http_responses_total_by_status_view_method_total"
        assert _value(after, name, **labels) - _value(before, name, **labels) == 1, labels
        name = "django_http_requests_latency_seconds_by_view_method_count"
        assert _value(after, name, **labels) - _value(before, name, **labels) == 1, labels
    executed = {"alias": "default", "vendor": "postgresql"}
    assert (
        _value(after, "django_db_execute_total", **executed)
        >= _value(before, "django_db_execute_total", **executed) + 2
    )  # at least the acquire and the release statements


def test_orm_reads_are_counted_by_the_engine(live_stack):
    url = live_stack.url("payments")
    executed = {"alias": "default", "vendor": "postgresql"}
    before = _samples(url)

    answer = requests.get(f"{url}/v1/payouts/{uuid.uuid4()}", timeout=5)

    assert answer.status_code == 404
    after = _samples(url)
    assert _value(after, "django_db_execute_total", **executed) > _value(
        before, "django_db_execute_total", **executed
    )
    latency = "django_db_query_duration_seconds_count"
    assert _value(after, latency, **executed) > _value(before, latency, **executed)


def test_no_id_a_request_carries_becomes_a_label_value(live_stack):
    payout_id, account_id = str(uuid.uuid4()), f"acct-{uuid.uuid4().hex}"
    key, idem = f"payout:{account_id}", f"idem-{uuid.uuid4().hex}"
    marker = uuid.uuid4().hex  # in query strings, paths, headers and bodies
    payments, locks = live_stack.url("payments"), live_stack.url("lockserver")
    calls = [
        ("GET", f"{payments}/v1/payouts/{payout_id}?m={marker}", None, {}),
        ("GET", f"{payments}/v1/accounts/{account_id}", None, {}),
        (
            "POST",
            f"{payments}/v1/payouts/{payout_id}/claim",
            {"ownerId": marker, "expectedState": "PENDING"},
            {"X-Fencing-Token": "7", "X-Fencing-Proof": marker, "X-Idempotency-Key": idem},
        ),
        ("GET", f"{payments}/v1/payouts?state=PENDING&accountId={account_id}", None, {}),
        ("GET", f"{payments}/{marker}/unrouted", None, {}),
        ("PUT", f"{payments}/v1/payouts/{payout_id}", {"x": marker}, {}),
        ("POST", f"{locks}/v1/locks/{key}/acquire", {"sessionId": marker}, {}),
        ("DELETE", f"{locks}/v1/locks/{key}?sessionId={marker}", None, {}),
        ("GET", f"{locks}/v1/sessions/{marker}", None, {}),
        ("POST", f"{live_stack.url('railproxy')}/v1/rail/submissions", {"payoutId": payout_id}, {}),
    ]
    for method, target, body, headers in calls:
        answer = requests.request(method, target, json=body, headers=headers, timeout=5)
        assert answer.status_code < 500, (target, answer.status_code)
        assert answer.headers["Content-Type"].startswith("application/json")

    secrets = {payout_id, account_id, key, idem, marker, account_id.removeprefix("acct-")}
    for role in ("payments", "lockserver", "railproxy"):
        for name, labels in _samples(live_stack.url(role)):
            for label, value in labels:
                assert not any(s in value for s in secrets), (role, name, label, value)
                if label == "view":  # a route's name, never a path
                    assert "/" not in value, (role, name, value)
