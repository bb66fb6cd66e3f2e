"""Decision 17's differential test: every hot route, plain view against its DRF class.

Each row builds its own fresh state (session, key, payout) on one arm and sends one request;
it runs once against the live stack's roles (plain views, dlock.hotview) and once against a
process of the same role on tests.hotpath.reference_urls (the DRF classes), same database, same
settings. Status, every response header but Date/Server, and the body text must be equal once
the values that legitimately differ are masked (traceId, ids, timestamps, proofs, lock tokens).
Afterwards: refused requests wrote nothing, and every account's balance is its ledger sum.
"""

from __future__ import annotations

import base64
import itertools
import json
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import psycopg
import pytest
import requests

from devstack.common import free_port
from devstack.roles import RoleProcess, stop_all
from dlock import proof
from tests import credentials
from tests.rail.conftest import stub_config_statement

pytestmark = pytest.mark.live

TIMEOUT = 15
OWNER = "w-diff"
HOT_ROLES = ("lockserver", "payments", "railproxy", "railstub")
IGNORED_HEADERS = {"date", "server", "content-length", "connection", "keep-alive"}
_MASKS = [
    (re.compile(r'"traceId":"[^"]*"'), '"traceId":"<trace>"'),
    (re.compile(r'"fencingToken":\d+'), '"fencingToken":"<token>"'),
    (re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.I), "<uuid>"),
    (re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z"), "<time>"),
    (re.compile(r"v2\.[A-Za-z0-9_\-]+\.[A-Za-z0-9_\-]{86}"), "<proof>"),
    (re.compile(r"acct-[0-9a-f]{16}"), "<account>"),
    (re.compile(r"ben-[0-9a-f]{12}"), "<beneficiary>"),  # payments.seeding's, per payout
    (re.compile(r"diff\.[0-9a-f]{12}"), "<key>"),
    (re.compile(r"rail-[A-Za-z0-9\-]+"), "<railref>"),
    (re.compile(r"RR-[0-9A-F]{20}"), "<railref>"),
]


# A browsable API page (DRF's on both arms) also names its own host and port and carries a
# fresh CSRF token, in the page and in its cookie.
_HTML_MASKS = [
    (re.compile(r"127\.0\.0\.1:\d+"), "<host>"),
    (re.compile(r"csrftoken=[A-Za-z0-9]+"), "csrftoken=<csrf>"),
    (re.compile(r"expires=[^;]+"), "expires=<time>"),
    (
        re.compile(
            r'(csrfToken|csrfmiddlewaretoken|csrf-token)([\'"]?[:=,]?\s*(?:value=)?[\'"])[^\'"]+'
        ),
        r"\1\2<csrf>",
    ),
]


def normalized(text: str, *, html: bool = False) -> str:
    for pattern, mask in _MASKS + (_HTML_MASKS if html else []):
        text = pattern.sub(mask, text)
    return text


@dataclass
class Arm:
    """One side of the comparison: the role URLs, its own account and PENDING payouts."""

    name: str
    urls: dict[str, str]
    account: str
    payouts: list[str]
    pay_url: str
    rail_url: str
    used: list[str] = field(default_factory=list)

    def url(self, role: str, path: str) -> str:
        return self.urls[role] + path

    def payout(self) -> str:
        payout_id = self.payouts.pop()
        self.used.append(payout_id)
        return payout_id

    def pay(self, sql: str, params=None):
        with psycopg.connect(self.pay_url, autocommit=True) as conn:
            cur = conn.execute(sql, params)
            return cur.fetchall() if cur.description else None

    def rail(self, sql: str, params=None):
        with psycopg.connect(self.rail_url, autocommit=True) as conn:
            cur = conn.execute(sql, params)
            return cur.fetchall() if cur.description else None


def send(
    method: str,
    url: str,
    *,
    body: object = None,
    raw: bytes | None = None,
    content_type: str | None = "application/json",
    headers: dict | None = None,
    params: dict | None = None,
) -> requests.Response:
    sent = dict(headers or {})
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    if data is not None and content_type is not None:
        sent.setdefault("Content-Type", content_type)
    with requests.Session() as http:  # Session.request: the suite's credential is added
        return http.request(method, url, data=data, headers=sent, params=params, timeout=TIMEOUT)


# -- lock-server rows -------------------------------------------------------------------------


def new_key() -> str:
    return f"diff.{uuid.uuid4().hex[:12]}"


def open_session(arm: Arm, ttl_ms: int = 10_000) -> str:
    response = send(
        "POST", arm.url("lockserver", "/v1/sessions"), body={"ownerId": OWNER, "ttlMillis": ttl_ms}
    )
    assert response.status_code == 201, response.text
    return response.json()["sessionId"]


def acquire(arm: Arm, *, key: str | None = None, body=None, **kw) -> requests.Response:
    key = key or new_key()
    if body is None and "raw" not in kw:
        body = {"sessionId": open_session(arm)}
    headers = {"X-Owner-Id": OWNER, **kw.pop("headers", {})}
    return send(
        kw.pop("method", "POST"),
        arm.url("lockserver", f"/v1/locks/{key}/acquire"),
        body=body,
        headers=headers,
        **kw,
    )


def granted(arm: Arm, ttl_ms: int = 10_000) -> tuple[str, str, dict]:
    sid = open_session(arm)
    key = new_key()
    response = acquire(arm, key=key, body={"sessionId": sid, "ttlMillis": ttl_ms})
    assert response.status_code == 200, response.text
    return key, sid, response.json()


def fence(key: str, token: int, fproof: str | None = None) -> dict[str, str]:
    return {
        "X-Fencing-Token": str(token),
        "X-Fencing-Proof": proof.sign(key=key, token=token) if fproof is None else fproof,
        "X-Owner-Id": OWNER,
    }


def release(arm: Arm, *, headers=None, params=None, body=None, raw=None, method="DELETE", **kw):
    key, sid, grant = granted(arm)
    sent = fence(key, grant["fencingToken"])
    for name, value in (headers or {}).items():
        if value is None:
            sent.pop(name, None)
        else:
            sent[name] = value
    query = (
        {"sessionId": sid} if params is None else {k: v.format(sid=sid) for k, v in params.items()}
    )
    if isinstance(body, dict):
        body = {k: v.format(sid=sid) if isinstance(v, str) else v for k, v in body.items()}
    return send(
        method,
        arm.url("lockserver", f"/v1/locks/{key}"),
        headers=sent,
        params=query,
        body=body,
        raw=raw,
        **kw,
    )


def renew(arm: Arm, *, headers=None, body=None, **kw):
    key, sid, grant = granted(arm)
    sent = fence(key, grant["fencingToken"])
    sent.update(headers or {})
    sent = {k: v for k, v in sent.items() if v is not None}
    return send(
        "POST",
        arm.url("lockserver", f"/v1/locks/{key}/renew"),
        headers=sent,
        body={"sessionId": sid} if body is None else body,
        **kw,
    )


def contended(arm: Arm) -> requests.Response:
    key, _, _ = granted(arm)
    return acquire(arm, key=key)


def expired_release(arm: Arm) -> requests.Response:
    key, sid, grant = granted(arm, ttl_ms=1_000)
    time.sleep(1.3)
    return send(
        "DELETE",
        arm.url("lockserver", f"/v1/locks/{key}"),
        headers=fence(key, grant["fencingToken"]),
        params={"sessionId": sid},
    )


def unknown_session(arm: Arm) -> requests.Response:
    return acquire(arm, body={"sessionId": str(uuid.uuid4())})


def with_session(arm: Arm, **extra) -> requests.Response:
    return acquire(arm, body={"sessionId": open_session(arm), **extra})


DEEP = b'{"sessionId":' + b"[" * 200 + b"]" * 200 + b"}"
NO_AUTH = {"Authorization": None}

LOCK_ROWS: dict[str, Callable[[Arm], requests.Response]] = {
    "acquire ok": lambda a: acquire(a),
    "acquire ok ttl+wait": lambda a: with_session(a, ttlMillis=5_000, waitMillis=0),
    "acquire ttl clamped": lambda a: with_session(a, ttlMillis=60_000),
    "acquire padded sessionId": lambda a: acquire(a, body={"sessionId": f"  {open_session(a)} "}),
    "acquire ttl 0": lambda a: with_session(a, ttlMillis=0),
    "acquire ttl negative": lambda a: with_session(a, ttlMillis=-5_000),
    "acquire ttl too small": lambda a: with_session(a, ttlMillis=999),
    "acquire ttl too big": lambda a: with_session(a, ttlMillis=60_001),
    "acquire ttl huge int": lambda a: with_session(a, ttlMillis=2**70),
    "acquire ttl string": lambda a: with_session(a, ttlMillis="5000"),
    "acquire ttl float": lambda a: with_session(a, ttlMillis=5000.0),
    "acquire ttl bool": lambda a: with_session(a, ttlMillis=True),
    "acquire ttl null": lambda a: with_session(a, ttlMillis=None),
    "acquire wait negative": lambda a: with_session(a, waitMillis=-1),
    "acquire wait too long": lambda a: with_session(a, waitMillis=30_001),
    "acquire extra field": lambda a: with_session(a, owner="x"),
    "acquire missing sessionId": lambda a: acquire(a, body={"ttlMillis": 5_000}),
    "acquire sessionId int": lambda a: acquire(a, body={"sessionId": 12}),
    "acquire sessionId not uuid": lambda a: acquire(a, body={"sessionId": "not-a-uuid"}),
    "acquire sessionId blank": lambda a: acquire(a, body={"sessionId": "   "}),
    "acquire sessionId NUL": lambda a: acquire(a, body={"sessionId": "a\x00b"}),
    "acquire sessionId unicode": lambda a: acquire(a, body={"sessionId": "sess\u2028ion"}),
    "acquire unknown session": unknown_session,
    "acquire contended": contended,
    "acquire bad JSON": lambda a: acquire(a, raw=b'{"sessionId":'),
    "acquire JSON array": lambda a: acquire(a, raw=b"[]"),
    "acquire JSON null": lambda a: acquire(a, raw=b"null"),
    "acquire JSON string": lambda a: acquire(a, raw=b'"x"'),
    "acquire JSON number": lambda a: acquire(a, raw=b"12"),
    "acquire JSON NaN": lambda a: acquire(a, raw=b'{"sessionId":"x","ttlMillis":NaN}'),
    "acquire duplicate keys": lambda a: acquire(a, raw=b'{"sessionId":"a","sessionId":"b"}'),
    "acquire deep nesting": lambda a: acquire(a, raw=DEEP),
    "acquire invalid utf-8": lambda a: acquire(a, raw=b'{"sessionId":"\xff"}'),
    "acquire empty body": lambda a: acquire(a, raw=b""),
    "acquire whitespace body": lambda a: acquire(a, raw=b"  \n "),
    "acquire text/plain": lambda a: acquire(a, raw=b"{}", content_type="text/plain"),
    "acquire no content type": lambda a: acquire(a, raw=b"{}", content_type=None),
    "acquire form content type": lambda a: acquire(
        a, raw=b"sessionId=x", content_type="application/x-www-form-urlencoded"
    ),
    "acquire json charset": lambda a: acquire(
        a,
        raw=json.dumps({"sessionId": open_session(a)}).encode(),
        content_type="application/json; charset=latin-1",
    ),
    "acquire content type wildcard": lambda a: acquire(a, raw=b"{}", content_type="*/*"),
    "acquire oversized": lambda a: acquire(a, raw=b'{"sessionId":"' + b"a" * 3_000_000 + b'"}'),
    "acquire missing owner": lambda a: acquire(a, headers={"X-Owner-Id": ""}),
    "acquire owner too long": lambda a: acquire(a, headers={"X-Owner-Id": "o" * 65}),
    "acquire owner not printable": lambda a: acquire(a, headers={"X-Owner-Id": "bad\x7fowner"}),
    "acquire bad key": lambda a: acquire(a, key="bad key!"),
    "acquire key too long": lambda a: acquire(a, key="k" * 129),
    "acquire no credential": lambda a: acquire(a, headers={"Authorization": ""}),
    "acquire wrong credential": lambda a: acquire(a, headers={"Authorization": "Bearer dlk_nope"}),
    "acquire malformed authorization": lambda a: acquire(a, headers={"Authorization": "Token x"}),
    "acquire operator scope only": lambda a: acquire(
        a, headers={"Authorization": f"Bearer {credentials.OPERATOR}"}
    ),
    "acquire Accept html": lambda a: acquire(a, headers={"Accept": "text/html"}),
    "acquire Accept unsatisfiable": lambda a: acquire(a, headers={"Accept": "application/xml"}),
    "acquire GET": lambda a: acquire(a, method="GET", body={}),
    "acquire PUT": lambda a: acquire(a, method="PUT", body={}),
    "acquire PATCH": lambda a: acquire(a, method="PATCH", body={}),
    "acquire HEAD": lambda a: acquire(a, method="HEAD", body={}),
    "acquire OPTIONS": lambda a: acquire(a, method="OPTIONS", body={}),
    "release ok": lambda a: release(a),
    "release session in body": lambda a: release(a, params={}, body={"sessionId": "{sid}"}),
    "release session in both": lambda a: release(a, body={"sessionId": "{sid}"}),
    "release sessions disagree": lambda a: release(a, body={"sessionId": str(uuid.uuid4())}),
    "release no session": lambda a: release(a, params={}),
    "release session not uuid": lambda a: release(a, params={"sessionId": "nope"}),
    "release body extra field": lambda a: release(a, body={"x": 1}),
    "release body array": lambda a: release(a, raw=b"[1]"),
    "release bad JSON": lambda a: release(a, raw=b"{"),
    "release text/plain body": lambda a: release(a, raw=b"{}", content_type="text/plain"),
    "release missing token": lambda a: release(a, headers={"X-Fencing-Token": None}),
    "release token not decimal": lambda a: release(a, headers={"X-Fencing-Token": "4_2"}),
    "release token zero": lambda a: release(a, headers={"X-Fencing-Token": "0"}),
    "release token negative": lambda a: release(a, headers={"X-Fencing-Token": "-1"}),
    "release token beyond int64": lambda a: release(a, headers={"X-Fencing-Token": str(2**63)}),
    "release wrong token": lambda a: release(
        a, headers={"X-Fencing-Token": "999999", "X-Fencing-Proof": None}
    ),
    "release missing proof": lambda a: release(a, headers={"X-Fencing-Proof": None}),
    "release malformed proof": lambda a: release(a, headers={"X-Fencing-Proof": "v1.x.y"}),
    "release forged proof": lambda a: release(
        a, headers={"X-Fencing-Proof": proof.sign(key="other", token=1)}
    ),
    "release unknown kid": lambda a: release(a, headers={"X-Fencing-Proof": "v2.zz." + "A" * 86}),
    "release expired grant": expired_release,
    "release missing owner": lambda a: release(a, headers={"X-Owner-Id": None}),
    "release no credential": lambda a: release(a, headers={"Authorization": ""}),
    "release GET (L7)": lambda a: release(a, method="GET"),
    "release HEAD (L7)": lambda a: release(a, method="HEAD"),
    "release OPTIONS": lambda a: release(a, method="OPTIONS"),
    "release PUT": lambda a: release(a, method="PUT"),
    "release POST": lambda a: release(a, method="POST", body={}),
    "renew ok": lambda a: renew(a),
    "renew ttl 0": lambda a: renew(a, body={"sessionId": open_session(a), "ttlMillis": 0}),
    "renew missing proof": lambda a: renew(a, headers={"X-Fencing-Proof": None}),
    "renew bad JSON": lambda a: renew(a, raw=b"{]"),
    "renew GET": lambda a: send("GET", a.url("lockserver", f"/v1/locks/{new_key()}/renew")),
}


# -- payment-resource and rail-proxy rows ----------------------------------------------------

_tokens = itertools.count(5_000_000_000 + (uuid.uuid4().int % 1_000_000) * 1_000)


def pay_headers(arm: Arm, token: int, key: str, **override) -> dict[str, str]:
    sent = {
        "X-Fencing-Token": str(token),
        "X-Fencing-Proof": proof.sign(key=proof.payout_key(arm.account), token=token),
        "X-Owner-Id": OWNER,
        "X-Idempotency-Key": key,
    }
    sent.update(override)
    return {k: v for k, v in sent.items() if v is not None}


def claim(
    arm: Arm, token: int, payout_id: str | None = None, *, body=None, **kw
) -> requests.Response:
    payout_id = payout_id or arm.payout()
    headers = pay_headers(arm, token, f"payout-{payout_id}", **kw.pop("headers", {}))
    return send(
        kw.pop("method", "POST"),
        arm.url("payments", f"/v1/payouts/{payout_id}/claim"),
        body={"expectedState": "PENDING"} if body is None and "raw" not in kw else body,
        headers=headers,
        **kw,
    )


def claimed(arm: Arm, token: int) -> str:
    payout_id = arm.payout()
    response = claim(arm, token, payout_id)
    assert response.status_code == 200, response.text
    return payout_id


def claim_replay(arm: Arm, token: int) -> requests.Response:
    return claim(arm, token, claimed(arm, token))


def claim_conflict(arm: Arm, token: int) -> requests.Response:
    return claim(arm, token, claimed(arm, token), body={"expectedState": "CLAIMED"})


def claim_stale(arm: Arm, token: int) -> requests.Response:
    claimed(arm, token)  # the account's fence is now `token`
    return claim(arm, token - 1)


def payout_row(arm: Arm, payout_id: str) -> tuple:
    return arm.pay(
        "SELECT amount_minor, currency, beneficiary_ref FROM payout WHERE payout_id = %s",
        [payout_id],
    )[0]


def submission(arm: Arm, payout_id: str, **override) -> dict:
    amount, currency, beneficiary = payout_row(arm, payout_id)
    body = {
        "payoutId": payout_id,
        "accountId": arm.account,
        "amountMinor": amount,
        "currency": currency,
        "beneficiaryRef": beneficiary,
    }
    body.update(override)
    return {k: v for k, v in body.items() if v is not None}


def submit(arm: Arm, token: int, payout_id: str | None = None, *, body=None, **kw):
    payout_id = payout_id or claimed(arm, token)
    headers = pay_headers(arm, token, f"payout-{payout_id}", **kw.pop("headers", {}))
    return send(
        kw.pop("method", "POST"),
        arm.url("railproxy", "/v1/rail/submissions"),
        body=submission(arm, payout_id) if body is None and "raw" not in kw else body,
        headers=headers,
        **kw,
    )


def submit_with(arm: Arm, token: int, **override) -> requests.Response:
    payout_id = claimed(arm, token)
    return submit(arm, token, payout_id, body=submission(arm, payout_id, **override))


def submit_replay(arm: Arm, token: int) -> requests.Response:
    payout_id = claimed(arm, token)
    first = submit(arm, token, payout_id)
    assert first.status_code == 200, first.text
    return submit(arm, token, payout_id)


def submit_conflict(arm: Arm, token: int) -> requests.Response:
    payout_id = claimed(arm, token)
    assert submit(arm, token, payout_id).status_code == 200
    return submit(arm, token, payout_id, body=submission(arm, payout_id, amountMinor=1))


def acked(arm: Arm, token: int) -> tuple[str, dict]:
    payout_id = claimed(arm, token)
    response = submit(arm, token, payout_id)
    assert response.status_code == 200, response.text
    return payout_id, response.json()


def post(arm: Arm, token: int, payout_id: str | None = None, *, body=None, **kw):
    if payout_id is None:
        payout_id, ack = acked(arm, token)
        body = body if body is not None else ack
    else:
        body = body if body is not None else {}
    if callable(body):
        body = body()
    headers = pay_headers(arm, token, f"payout-{payout_id}", **kw.pop("headers", {}))
    return send(
        kw.pop("method", "POST"),
        arm.url("payments", f"/v1/payouts/{payout_id}/post"),
        body=body,
        headers=headers,
        **kw,
    )


def post_ok(arm: Arm, token: int, *, replay: bool = False) -> requests.Response:
    payout_id, ack = acked(arm, token)
    body = {"railReference": ack["railReference"], "submissionId": ack["submissionId"]}
    first = post(arm, token, payout_id, body=body)
    if not replay:
        return first
    assert first.status_code == 200, first.text
    return post(arm, token, payout_id, body=body)


def post_conflict(arm: Arm, token: int) -> requests.Response:
    payout_id, ack = acked(arm, token)
    body = {"railReference": ack["railReference"], "submissionId": ack["submissionId"]}
    assert post(arm, token, payout_id, body=body).status_code == 200
    return post(arm, token, payout_id, body={**body, "railReference": "rail-other"})


def post_fields(arm: Arm, token: int, **fields) -> requests.Response:
    payout_id = claimed(arm, token)
    body = {"railReference": "rail-x", "submissionId": str(uuid.uuid4()), **fields}
    return post(arm, token, payout_id, body={k: v for k, v in body.items() if v is not None})


PAY_ROWS: dict[str, Callable[[Arm, int], requests.Response]] = {
    "claim ok": lambda a, t: claim(a, t),
    "claim replay": claim_replay,
    "claim idempotency conflict": claim_conflict,
    "claim stale token": claim_stale,
    "claim expectedState invalid": lambda a, t: claim(a, t, body={"expectedState": "POSTED"}),
    "claim expectedState int": lambda a, t: claim(a, t, body={"expectedState": 5}),
    "claim missing field": lambda a, t: claim(a, t, body={}),
    "claim extra field": lambda a, t: claim(a, t, body={"expectedState": "PENDING", "x": 1}),
    "claim bad JSON": lambda a, t: claim(a, t, raw=b"{"),
    "claim JSON array": lambda a, t: claim(a, t, raw=b'["PENDING"]'),
    "claim empty body": lambda a, t: claim(a, t, raw=b""),
    "claim text/plain": lambda a, t: claim(a, t, raw=b"{}", content_type="text/plain"),
    "claim missing token": lambda a, t: claim(a, t, headers={"X-Fencing-Token": None}),
    "claim token huge": lambda a, t: claim(a, t, headers={"X-Fencing-Token": "9" * 30}),
    "claim missing proof": lambda a, t: claim(a, t, headers={"X-Fencing-Proof": None}),
    "claim forged proof": lambda a, t: claim(
        a, t, headers={"X-Fencing-Proof": proof.sign(key="payout:acct-other", token=t)}
    ),
    "claim missing owner": lambda a, t: claim(a, t, headers={"X-Owner-Id": None}),
    "claim missing idempotency key": lambda a, t: claim(a, t, headers={"X-Idempotency-Key": None}),
    "claim bad idempotency key": lambda a, t: claim(a, t, headers={"X-Idempotency-Key": "a b"}),
    "claim unknown payout": lambda a, t: claim(a, t, str(uuid.uuid4())),
    "claim payout id not uuid": lambda a, t: claim(a, t, "not-a-uuid"),
    "claim no credential": lambda a, t: claim(a, t, headers={"Authorization": ""}),
    "claim operator scope only": lambda a, t: claim(
        a, t, headers={"Authorization": f"Bearer {credentials.OPERATOR}"}
    ),
    "claim GET": lambda a, t: claim(a, t, method="GET", body={}),
    "claim OPTIONS": lambda a, t: claim(a, t, method="OPTIONS", body={}),
    "claim HEAD": lambda a, t: claim(a, t, method="HEAD", body={}),
    "submit ok": lambda a, t: submit(a, t),
    "submit replay": submit_replay,
    "submit idempotency conflict": submit_conflict,
    "submit amount zero": lambda a, t: submit_with(a, t, amountMinor=0),
    "submit amount negative": lambda a, t: submit_with(a, t, amountMinor=-100),
    "submit amount huge": lambda a, t: submit_with(a, t, amountMinor=2**70),
    "submit amount string": lambda a, t: submit_with(a, t, amountMinor="100"),
    "submit amount float": lambda a, t: submit_with(a, t, amountMinor=1.5),
    "submit currency lower": lambda a, t: submit_with(a, t, currency="eur"),
    "submit payoutId not uuid": lambda a, t: submit_with(a, t, payoutId="nope"),
    "submit missing field": lambda a, t: submit_with(a, t, beneficiaryRef=None),
    "submit extra field": lambda a, t: submit_with(a, t, extra=True),
    "submit account mismatch": lambda a, t: submit_with(a, t, accountId="acct-0000000000000000"),
    "submit bad JSON": lambda a, t: submit(a, t, raw=b'{"payoutId"'),
    "submit JSON number": lambda a, t: submit(a, t, raw=b"7"),
    "submit empty body": lambda a, t: submit(a, t, raw=b""),
    "submit wrong content type": lambda a, t: submit(a, t, raw=b"{}", content_type="text/xml"),
    "submit missing proof": lambda a, t: submit(a, t, headers={"X-Fencing-Proof": None}),
    "submit stale token": lambda a, t: submit(a, t - 1, claimed(a, t)),
    "submit missing token": lambda a, t: submit(a, t, headers={"X-Fencing-Token": None}),
    "submit no credential": lambda a, t: submit(a, t, headers={"Authorization": ""}),
    "submit GET": lambda a, t: send("GET", a.url("railproxy", "/v1/rail/submissions")),
    "submit OPTIONS": lambda a, t: send("OPTIONS", a.url("railproxy", "/v1/rail/submissions")),
    "post ok": lambda a, t: post_ok(a, t),
    "post replay": lambda a, t: post_ok(a, t, replay=True),
    "post idempotency conflict": post_conflict,
    "post not acked": lambda a, t: post_fields(a, t),
    "post missing railReference": lambda a, t: post_fields(a, t, railReference=None),
    "post railReference too long": lambda a, t: post_fields(a, t, railReference="r" * 129),
    "post submissionId not uuid": lambda a, t: post_fields(a, t, submissionId="x"),
    "post railOutcome wrong": lambda a, t: post_fields(a, t, railOutcome="NACKED"),
    "post bad JSON": lambda a, t: post(a, t, claimed(a, t), body=None, raw=b"{,}"),
    "post missing proof": lambda a, t: post(
        a, t, claimed(a, t), body={}, headers={"X-Fencing-Proof": None}
    ),
    "post GET": lambda a, t: post(a, t, claimed(a, t), method="GET", body={}),
}

# Rows whose request is refused before any write: the payout they touch must be unchanged.
REFUSED_PAY_ROWS = {name for name in PAY_ROWS if name.startswith("claim ")} - {
    "claim ok",
    "claim replay",
    "claim idempotency conflict",
    "claim stale token",
}


# -- P1 / P4 reads (plain for a JSON GET, the browsable API and the rest DRF's) ----------------
#
# Both arms read the same database back to back with nothing written in between, so a query
# over every account answers the same rows (cursors included); a query over the arm's own
# account, in one state, answers rows of the same shape (the two accounts live through the same
# rows, though not on payouts at the same place in created_at order).


def read(arm: Arm, path: str, **kw) -> requests.Response:
    return send(kw.pop("method", "GET"), arm.url("payments", path), content_type=None, **kw)


def listing(arm: Arm, params: dict | None = None, **kw) -> requests.Response:
    return read(arm, "/v1/payouts", params=params, **kw)


def own_listing(arm: Arm, **extra) -> requests.Response:
    return listing(arm, {"accountId": arm.account, "limit": "500", **extra})


def next_page(arm: Arm, params: dict) -> requests.Response:
    first = listing(arm, params)
    assert first.status_code == 200 and "nextCursor" in first.json(), first.text
    return listing(arm, {**params, "cursor": first.json()["nextCursor"]})


def cursor_of(payload: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(payload).encode()).decode().rstrip("=")


def forged_cursor(**change) -> str:
    position = {"at": "2026-12-01T10:00:00+00:00", "id": str(uuid.uuid4()), "state": ""}
    position.update(change)
    return cursor_of([1, position["at"], position["id"], position["state"], ""])


def detail(arm: Arm, payout_id: str, suffix: str = "", **kw) -> requests.Response:
    return read(arm, f"/v1/payouts/{payout_id}{suffix}", **kw)


def posted_detail(arm: Arm, token: int) -> requests.Response:
    payout_id, ack = acked(arm, token)
    body = {"railReference": ack["railReference"], "submissionId": ack["submissionId"]}
    assert post(arm, token, payout_id, body=body).status_code == 200
    return detail(arm, payout_id)


BROWSER = {"Accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"}
OPERATOR = {"Authorization": f"Bearer {credentials.OPERATOR}"}

READ_ROWS: dict[str, Callable[[Arm, int], requests.Response]] = {
    "list default": lambda a, t: listing(a),
    "list PENDING page": lambda a, t: listing(a, {"state": "PENDING", "limit": "3"}),
    "list POSTED": lambda a, t: listing(a, {"state": "POSTED", "limit": "500"}),
    "list own account PENDING": lambda a, t: own_listing(a, state="PENDING"),
    "list own account CLAIMED": lambda a, t: own_listing(a, state="CLAIMED"),
    "list next page": lambda a, t: next_page(a, {"limit": "2"}),
    "list next page filtered": lambda a, t: next_page(a, {"state": "PENDING", "limit": "2"}),
    "list empty state": lambda a, t: listing(a, {"state": "", "limit": "2"}),
    "list state lower case": lambda a, t: listing(a, {"state": "pending"}),
    "list state unknown": lambda a, t: listing(a, {"state": "LOST"}),
    "list accountId too long": lambda a, t: listing(a, {"accountId": "a" * 65}),
    "list accountId unknown": lambda a, t: listing(a, {"accountId": "acct-nobody"}),
    "list accountId unicode": lambda a, t: listing(a, {"accountId": "kontó\u2028"}),
    "list limit 0": lambda a, t: listing(a, {"limit": "0"}),
    "list limit 1": lambda a, t: listing(a, {"limit": "1"}),
    "list limit 500": lambda a, t: listing(a, {"limit": "500", "state": "POSTED"}),
    "list limit 501": lambda a, t: listing(a, {"limit": "501"}),
    "list limit negative": lambda a, t: listing(a, {"limit": "-1"}),
    "list limit float": lambda a, t: listing(a, {"limit": "1.5"}),
    "list limit text": lambda a, t: listing(a, {"limit": "ten"}),
    "list limit padded": lambda a, t: listing(a, {"limit": " 5"}),
    "list limit leading zeros": lambda a, t: listing(a, {"limit": "0005"}),
    "list limit huge": lambda a, t: listing(a, {"limit": "9" * 40}),
    "list limit arabic digits": lambda a, t: listing(a, {"limit": "\u0665"}),
    "list limit empty": lambda a, t: listing(a, {"limit": ""}),
    "list limit twice": lambda a, t: listing(a, {"limit": ["1", "2"]}),
    "list state twice": lambda a, t: listing(a, {"state": ["PENDING", "PENDING"]}),
    "list unknown param": lambda a, t: listing(a, {"page": "2"}),
    "list unknown params sorted": lambda a, t: listing(a, {"zeta": "1", "alpha": "2"}),
    "list cursor garbage": lambda a, t: listing(a, {"cursor": "!!!not-base64!!!"}),
    "list cursor not json": lambda a, t: listing(a, {"cursor": "bm90IGpzb24"}),
    "list cursor too long": lambda a, t: listing(a, {"cursor": "A" * 513}),
    "list cursor wrong shape": lambda a, t: listing(a, {"cursor": cursor_of({"a": 1})}),
    "list cursor wrong version": lambda a, t: listing(
        a, {"cursor": cursor_of([2, "", "", "", ""])}
    ),
    "list cursor bad time": lambda a, t: listing(a, {"cursor": forged_cursor(at="yesterday")}),
    "list cursor bad id": lambda a, t: listing(a, {"cursor": forged_cursor(id="nope")}),
    "list cursor forged offset": lambda a, t: listing(
        a, {"cursor": forged_cursor(at="2026-12-01T10:00:00+23:59")}
    ),
    "list cursor other filters": lambda a, t: listing(
        a, {"cursor": forged_cursor(state="POSTED"), "state": "PENDING"}
    ),
    "list cursor forged position": lambda a, t: listing(a, {"cursor": forged_cursor()}),
    "list format json": lambda a, t: listing(a, {"format": "json"}),
    "list format api": lambda a, t: listing(a, {"format": "api"}),
    "list no Accept": lambda a, t: listing(a, {"limit": "2"}, headers={"Accept": None}),
    "list Accept json": lambda a, t: listing(
        a, {"limit": "2"}, headers={"Accept": "application/json"}
    ),
    "list Accept application/*": lambda a, t: listing(
        a, {"limit": "2"}, headers={"Accept": "application/*"}
    ),
    "list Accept indent": lambda a, t: listing(
        a, {"limit": "2"}, headers={"Accept": "application/json; indent=4"}
    ),
    "list Accept q": lambda a, t: listing(a, {"limit": "2"}, headers={"Accept": "*/*;q=0.5"}),
    "list Accept empty": lambda a, t: listing(a, {"limit": "2"}, headers={"Accept": ""}),
    "list Accept unsatisfiable": lambda a, t: listing(
        a, {"limit": "2"}, headers={"Accept": "application/xml"}
    ),
    "list Accept html (browsable)": lambda a, t: listing(a, {"limit": "2"}, headers=BROWSER),
    "list browsable bad limit": lambda a, t: listing(a, {"limit": "0"}, headers=BROWSER),
    "list no credential": lambda a, t: listing(a, headers={"Authorization": ""}),
    "list wrong credential": lambda a, t: listing(a, headers={"Authorization": "Bearer dlk_x"}),
    "list malformed authorization": lambda a, t: listing(a, headers={"Authorization": "Basic x"}),
    "list operator scope only": lambda a, t: listing(a, headers=OPERATOR),
    "list POST": lambda a, t: listing(a, method="POST"),
    "list PUT": lambda a, t: listing(a, method="PUT"),
    "list DELETE": lambda a, t: listing(a, method="DELETE"),
    "list PATCH": lambda a, t: listing(a, method="PATCH"),
    "list HEAD": lambda a, t: listing(a, {"limit": "2"}, method="HEAD"),
    "list OPTIONS": lambda a, t: listing(a, method="OPTIONS"),
    "list trailing slash": lambda a, t: read(a, "/v1/payouts/"),
    "detail pending": lambda a, t: detail(a, a.payout()),
    "detail claimed": lambda a, t: detail(a, claimed(a, t)),
    "detail acked": lambda a, t: detail(a, acked(a, t)[0]),
    "detail posted": posted_detail,
    "detail unknown id": lambda a, t: detail(a, str(uuid.uuid4())),
    "detail upper-case id": lambda a, t: detail(a, a.payout().upper()),
    "detail id without dashes": lambda a, t: detail(a, a.payout().replace("-", "")),
    "detail id in braces": lambda a, t: detail(a, "{" + a.payout() + "}"),
    "detail id not uuid": lambda a, t: detail(a, "not-a-uuid"),
    "detail id unicode": lambda a, t: detail(a, "zahlung-ü"),
    "detail id very long": lambda a, t: detail(a, "9" * 2_000),
    "detail query ignored": lambda a, t: detail(a, a.payout(), params={"x": "1"}),
    "detail format json": lambda a, t: detail(a, a.payout(), params={"format": "json"}),
    "detail format api": lambda a, t: detail(a, a.payout(), params={"format": "api"}),
    "detail format unknown": lambda a, t: detail(a, a.payout(), params={"format": "xml"}),
    "detail no Accept": lambda a, t: detail(a, a.payout(), headers={"Accept": None}),
    "detail Accept indent": lambda a, t: detail(
        a, a.payout(), headers={"Accept": "application/json; indent=2"}
    ),
    "detail Accept html (browsable)": lambda a, t: detail(a, a.payout(), headers=BROWSER),
    "detail browsable unknown id": lambda a, t: detail(a, str(uuid.uuid4()), headers=BROWSER),
    "detail no credential": lambda a, t: detail(a, a.payout(), headers={"Authorization": ""}),
    "detail forged credential": lambda a, t: detail(
        a, a.payout(), headers={"Authorization": "Bearer dlk_forged"}
    ),
    "detail operator scope only": lambda a, t: detail(a, a.payout(), headers=OPERATOR),
    "detail unknown id no credential": lambda a, t: detail(
        a, str(uuid.uuid4()), headers={"Authorization": ""}
    ),
    "detail POST": lambda a, t: detail(a, a.payout(), method="POST"),
    "detail PUT": lambda a, t: detail(a, a.payout(), method="PUT"),
    "detail DELETE": lambda a, t: detail(a, a.payout(), method="DELETE"),
    "detail HEAD": lambda a, t: detail(a, a.payout(), method="HEAD"),
    "detail OPTIONS": lambda a, t: detail(a, a.payout(), method="OPTIONS"),
    "detail trailing slash": lambda a, t: detail(a, a.payout(), "/"),
}


# -- rail stub rows (POST /submit; the stub's faults are set per row on its shared config) -------


def stub_config(arm: Arm, **values) -> None:
    arm.rail(*stub_config_statement(**values))


def rail_submit(arm: Arm, ref: str, *, body=None, **kw) -> requests.Response:
    if body is None and "raw" not in kw:
        body = {"clientRef": ref, "amountMinor": 990, "currency": "EUR"}
    return send(kw.pop("method", "POST"), arm.url("railstub", "/submit"), body=body, **kw)


def transfer(ref: str, **override) -> dict:
    body = {"clientRef": ref, "amountMinor": 990, "currency": "EUR", **override}
    return {k: v for k, v in body.items() if v is not ...}


def stub_repeat(arm: Arm, ref: str) -> requests.Response:
    assert rail_submit(arm, ref).status_code == 200
    return rail_submit(arm, ref)


def with_faults(**config) -> Callable[[Arm, str], requests.Response]:
    def row(arm: Arm, ref: str) -> requests.Response:
        stub_config(arm, **config)
        return rail_submit(arm, ref)

    return row


# row → (transfers booked, requests logged) for its clientRef afterwards
STUB_ROWS: dict[str, tuple[Callable[[Arm, str], requests.Response], int, int]] = {
    "stub ok": (lambda a, r: rail_submit(a, r), 1, 1),
    "stub repeat books again": (stub_repeat, 2, 2),
    "stub duplicate ack": (with_faults(duplicate_ack_rate=1.0), 2, 1),
    "stub declined": (with_faults(decline_rate=1.0), 0, 1),
    "stub injected 5xx": (
        with_faults(failure_rate=1.0, split_drop_before=0, split_drop_after=0),
        0,
        1,
    ),
    "stub padded clientRef": (lambda a, r: rail_submit(a, r, body=transfer(f" {r} ")), 1, 1),
    "stub clientRef 128": (
        lambda a, r: rail_submit(a, r, body=transfer(r + "x" * (128 - len(r)))),
        1,
        1,
    ),
    "stub clientRef 129": (
        lambda a, r: rail_submit(a, r, body=transfer(r + "x" * (129 - len(r)))),
        0,
        0,
    ),
    "stub clientRef empty": (lambda a, r: rail_submit(a, r, body=transfer("")), 0, 0),
    "stub clientRef blank": (lambda a, r: rail_submit(a, r, body=transfer("  ")), 0, 0),
    "stub clientRef int": (lambda a, r: rail_submit(a, r, body=transfer(7)), 0, 0),
    "stub clientRef NUL": (lambda a, r: rail_submit(a, r, body=transfer(r + "\x00")), 0, 0),
    "stub clientRef unicode": (lambda a, r: rail_submit(a, r, body=transfer(r + "\u2028ü")), 1, 1),
    "stub clientRef surrogate": (
        lambda a, r: rail_submit(
            a, r, raw=b'{"clientRef":"\\ud800","amountMinor":1,"currency":"EUR"}'
        ),
        0,
        0,
    ),
    "stub amount 1": (lambda a, r: rail_submit(a, r, body=transfer(r, amountMinor=1)), 1, 1),
    "stub amount int64 max": (
        lambda a, r: rail_submit(a, r, body=transfer(r, amountMinor=2**63 - 1)),
        1,
        1,
    ),
    "stub amount beyond int64": (
        lambda a, r: rail_submit(a, r, body=transfer(r, amountMinor=2**63)),
        0,
        0,
    ),
    "stub amount zero": (lambda a, r: rail_submit(a, r, body=transfer(r, amountMinor=0)), 0, 0),
    "stub amount negative": (
        lambda a, r: rail_submit(a, r, body=transfer(r, amountMinor=-1)),
        0,
        0,
    ),
    "stub amount string": (
        lambda a, r: rail_submit(a, r, body=transfer(r, amountMinor="990")),
        0,
        0,
    ),
    "stub amount float": (
        lambda a, r: rail_submit(a, r, body=transfer(r, amountMinor=990.0)),
        0,
        0,
    ),
    "stub amount bool": (lambda a, r: rail_submit(a, r, body=transfer(r, amountMinor=True)), 0, 0),
    "stub amount null": (lambda a, r: rail_submit(a, r, body=transfer(r, amountMinor=None)), 0, 0),
    "stub currency lower": (lambda a, r: rail_submit(a, r, body=transfer(r, currency="eur")), 0, 0),
    "stub currency long": (lambda a, r: rail_submit(a, r, body=transfer(r, currency="EURO")), 0, 0),
    "stub currency accented": (
        lambda a, r: rail_submit(a, r, body=transfer(r, currency="ÉUR")),
        0,
        0,
    ),
    "stub currency int": (lambda a, r: rail_submit(a, r, body=transfer(r, currency=978)), 0, 0),
    "stub missing field": (lambda a, r: rail_submit(a, r, body=transfer(r, currency=...)), 0, 0),
    "stub extra field": (lambda a, r: rail_submit(a, r, body=transfer(r, token="x")), 0, 0),
    "stub empty object": (lambda a, r: rail_submit(a, r, body={}), 0, 0),
    "stub JSON array": (lambda a, r: rail_submit(a, r, raw=b"[]"), 0, 0),
    "stub JSON null": (lambda a, r: rail_submit(a, r, raw=b"null"), 0, 0),
    "stub bad JSON": (lambda a, r: rail_submit(a, r, raw=b'{"clientRef":'), 0, 0),
    "stub duplicate keys": (
        lambda a, r: rail_submit(a, r, raw=b'{"clientRef":"a","clientRef":"b"}'),
        0,
        0,
    ),
    "stub deep nesting": (
        lambda a, r: rail_submit(a, r, raw=b'{"clientRef":' + b"[" * 200 + b"]" * 200 + b"}"),
        0,
        0,
    ),
    "stub invalid utf-8": (lambda a, r: rail_submit(a, r, raw=b'{"clientRef":"\xff"}'), 0, 0),
    "stub empty body": (lambda a, r: rail_submit(a, r, raw=b""), 0, 0),
    "stub text/plain": (lambda a, r: rail_submit(a, r, raw=b"{}", content_type="text/plain"), 0, 0),
    "stub no content type": (lambda a, r: rail_submit(a, r, raw=b"{}", content_type=None), 0, 0),
    "stub oversized": (
        lambda a, r: rail_submit(a, r, raw=b'{"clientRef":"' + b"a" * 3_000_000 + b'"}'),
        0,
        0,
    ),
    "stub Accept html": (lambda a, r: rail_submit(a, r, headers=BROWSER), 1, 1),
    "stub Accept indent": (
        lambda a, r: rail_submit(a, r, headers={"Accept": "application/json; indent=4"}),
        1,
        1,
    ),
    "stub forged credential": (
        lambda a, r: rail_submit(a, r, headers={"Authorization": "Bearer dlk_x"}),
        1,
        1,
    ),
    "stub GET": (lambda a, r: rail_submit(a, r, method="GET", body={}), 0, 0),
    "stub PUT": (lambda a, r: rail_submit(a, r, method="PUT"), 0, 0),
    "stub DELETE": (lambda a, r: rail_submit(a, r, method="DELETE", body={}), 0, 0),
    "stub HEAD": (lambda a, r: rail_submit(a, r, method="HEAD", body={}), 0, 0),
    "stub OPTIONS": (lambda a, r: rail_submit(a, r, method="OPTIONS", body={}), 0, 0),
    "stub trailing slash": (
        lambda a, r: send("POST", a.url("railstub", "/submit/"), body=transfer(r)),
        0,
        0,
    ),
    # a foreign Host on POST /submit: CommonMiddleware's 400 in both arms
    "stub foreign Host": (lambda a, r: rail_submit(a, r, headers={"Host": "evil.example"}), 0, 0),
    "stub foreign Host with port": (
        lambda a, r: rail_submit(a, r, headers={"Host": "evil.example:8084"}),
        0,
        0,
    ),
    "stub malformed Host": (lambda a, r: rail_submit(a, r, headers={"Host": "a b"}), 0, 0),
    "stub localhost Host": (lambda a, r: rail_submit(a, r, headers={"Host": "localhost"}), 1, 1),
    "stub format query": (
        lambda a, r: send("POST", a.url("railstub", "/submit?format=json"), body=transfer(r)),
        1,
        1,
    ),
    "stub query string": (
        lambda a, r: send("POST", a.url("railstub", "/submit?x=1"), body=transfer(r)),
        1,
        1,
    ),
    "stub NUL in query": (
        lambda a, r: send("POST", a.url("railstub", "/submit?x=%00"), body=transfer(r)),
        0,
        0,
    ),
    "stub chunked body": (
        lambda a, r: rail_submit(
            a,
            r,
            raw=iter([json.dumps(transfer(r)).encode()]),  # type: ignore[arg-type]
        ),
        0,
        0,
    ),
    "stub Accept xml": (
        lambda a, r: rail_submit(a, r, headers={"Accept": "application/xml"}),
        1,
        1,
    ),
    "stub unknown path": (lambda a, r: send("POST", a.url("railstub", "/submitx"), body={}), 0, 0),
    "stub health live": (lambda a, r: send("GET", a.url("railstub", "/health/live")), 0, 0),
}


# -- fixtures and the comparison --------------------------------------------------------------


@pytest.fixture(scope="module")
def arms(live_stack):
    references = {}
    for role in HOT_ROLES:
        port = free_port()
        references[role] = RoleProcess(
            role,
            port,
            live_stack.env,
            live_stack.logdir / f"{role}-reference.log",
            app="tests.hotpath.reference_wsgi",
        ).start(wait=False)
    for process in references.values():
        process.wait_ready()
    done = live_stack.manage(
        "seed_payouts",
        "--accounts=2",
        "--payouts-per-account=120",
        "--balance-minor=100000000",
        "--amount-minor=1000",
        "--json",
    )
    seeded = json.loads(done.stdout.strip().splitlines()[-1])
    pay_url = live_stack.env["PAY_DATABASE_URL"]
    accounts = seeded["accounts"]
    owned = {account: [] for account in accounts}
    with psycopg.connect(pay_url, autocommit=True) as conn:
        for payout_id, account in conn.execute(
            "SELECT payout_id::text, account_id FROM payout WHERE account_id = ANY(%s)",
            [accounts],
        ):
            owned[account].append(payout_id)
    rail_url = live_stack.env["RAIL_DATABASE_URL"]
    hot = Arm(
        "hot",
        {r: live_stack.url(r) for r in HOT_ROLES},
        accounts[0],
        owned[accounts[0]],
        pay_url,
        rail_url,
    )
    ref = Arm(
        "ref",
        {r: p.url for r, p in references.items()},
        accounts[1],
        owned[accounts[1]],
        pay_url,
        rail_url,
    )
    yield hot, ref
    stop_all(references.values())


def assert_same(hot: requests.Response, ref: requests.Response) -> None:
    assert hot.status_code == ref.status_code, (hot.text, ref.text)
    html = hot.headers.get("Content-Type", "").startswith("text/html")

    def headers(response: requests.Response) -> dict[str, str]:
        return {
            k.lower(): normalized(v, html=True) if html else v
            for k, v in response.headers.items()
            if k.lower() not in IGNORED_HEADERS
        }

    assert headers(hot) == headers(ref)
    assert normalized(hot.text, html=html) == normalized(ref.text, html=html)
    for response in (hot, ref):
        if "content-length" in response.headers and response.request.method != "HEAD":
            assert int(response.headers["content-length"]) == len(response.content)


@pytest.mark.parametrize("row", list(LOCK_ROWS))
def test_lock_server_rows_answer_the_same(arms, row):
    hot, ref = arms
    assert_same(LOCK_ROWS[row](hot), LOCK_ROWS[row](ref))


@pytest.mark.parametrize("row", list(PAY_ROWS))
def test_payout_rows_answer_the_same(arms, row):
    hot, ref = arms
    token = next(_tokens)
    before = {arm.name: len(arm.used) for arm in arms}
    answers = [PAY_ROWS[row](arm, token) for arm in arms]
    assert_same(*answers)
    if row in REFUSED_PAY_ROWS:
        for arm in arms:
            for payout_id in arm.used[before[arm.name] :]:
                state, claim_token = arm.pay(
                    "SELECT state, claim_token FROM payout WHERE payout_id = %s", [payout_id]
                )[0]
                assert (state, claim_token) == ("PENDING", None), (arm.name, row)
                records = arm.pay(
                    "SELECT count(*) FROM idempotency_record WHERE payout_id = %s", [payout_id]
                )[0][0]
                assert records == 0, (arm.name, row)


@pytest.mark.parametrize("row", list(READ_ROWS))
def test_payout_reads_answer_the_same(arms, row):
    token = next(_tokens)
    assert_same(*[READ_ROWS[row](arm, token) for arm in arms])


def test_a_browser_still_gets_the_browsable_api_from_the_plain_read_routes(arms):
    hot, _ = arms
    payout_id = hot.payout()
    for path in ("/v1/payouts?limit=2", f"/v1/payouts/{payout_id}"):
        page = read(hot, path, headers=BROWSER)
        assert page.status_code == 200
        assert page.headers["Content-Type"] == "text/html; charset=utf-8"
        assert "<html" in page.text and "Allow" in page.headers
        machine = read(hot, path, headers={"Accept": "application/json"})
        assert machine.headers["Content-Type"] == "application/json; charset=utf-8"
        assert machine.json()


@pytest.mark.parametrize("row", list(STUB_ROWS))
def test_rail_stub_rows_answer_the_same(arms, row):
    fn, transfers, requests_logged = STUB_ROWS[row]
    answers = []
    try:
        for arm in arms:
            ref = f"diff-{arm.name}-{uuid.uuid4().hex[:12]}"
            answers.append(fn(arm, ref))
            booked = arm.rail(
                "SELECT count(*) FROM rail_transfer WHERE client_ref LIKE %s", [f"%{ref}%"]
            )[0][0]
            logged = arm.rail(
                "SELECT count(*) FROM rail_request WHERE client_ref LIKE %s", [f"%{ref}%"]
            )[0][0]
            assert (booked, logged) == (transfers, requests_logged), (arm.name, row)
    finally:
        stub_config(arms[0])
    assert_same(*answers)


def test_a_refused_submission_writes_no_rail_row(arms):
    for arm in arms:
        payout_id = claimed(arm, token := next(_tokens))
        response = submit(arm, token, payout_id, body=submission(arm, payout_id, amountMinor=0))
        assert response.status_code == 400
        rows = arm.pay("SELECT count(*) FROM rail_submission WHERE payout_id = %s", [payout_id])
        assert rows[0][0] == 0


def test_the_books_balance_after_the_matrix(arms):
    for arm in arms:
        account = send("GET", arm.url("payments", f"/v1/accounts/{arm.account}")).json()
        assert account["balanceMinor"] == account["ledgerSumMinor"]
        ((balance, ledger),) = arm.pay(
            "SELECT a.balance_minor, (SELECT COALESCE(sum(CASE l.direction WHEN 'CREDIT'"
            " THEN l.amount_minor ELSE -l.amount_minor END), 0) FROM ledger_entry l"
            " WHERE l.account_id = a.account_id) FROM account a WHERE a.account_id = %s",
            [arm.account],
        )
        assert balance == ledger
    posted = [
        arm.pay(
            "SELECT count(*) FROM payout WHERE account_id = %s AND state = 'POSTED'", [arm.account]
        )
        for arm in arms
    ]
    assert posted[0] == posted[1] and posted[0][0][0] > 0


def test_the_hot_routes_are_the_plain_views(live_stack):
    from lockserver import routes as lock_routes
    from payments import routes as pay_routes
    from railproxy import routes as rail_routes
    from railstub import routes as stub_routes
    from tests.hotpath.routes import hot_routes

    names = hot_routes(
        lock_routes.urlpatterns
        + pay_routes.urlpatterns
        + rail_routes.urlpatterns
        + stub_routes.urlpatterns
    )
    assert sorted(names) == sorted(
        [
            "lock-acquire",
            "lock-renew",
            "lock",
            "payout-claim",
            "payout-post",
            "rail-submissions",
            "payouts-list",
            "payout-detail",
            "railstub-submit",
        ]
    )


@pytest.mark.parametrize("role", HOT_ROLES)
def test_the_openapi_description_is_the_drf_views_byte_for_byte(arms, role):
    """drf-spectacular reads hot_view's `cls` (the DRF class): the role's /v1/schema is the one
    the reference URLconf, where the DRF classes serve the routes, generates."""
    hot, ref = arms
    for fmt in ("json", "yaml"):
        answers = [send("GET", arm.url(role, f"/v1/schema?format={fmt}")) for arm in arms]
        assert [a.status_code for a in answers] == [200, 200]
        assert answers[0].content == answers[1].content
    paths = send("GET", hot.url(role, "/v1/schema?format=json")).json()
    operations = {(m, p) for p, item in paths["paths"].items() for m in item}
    expected = {
        "lockserver": {("post", "/v1/locks/{key}/acquire"), ("delete", "/v1/locks/{key}")},
        "payments": {
            ("post", "/v1/payouts/{payout_id}/claim"),
            ("get", "/v1/payouts"),
            ("get", "/v1/payouts/{payout_id}"),
        },
        "railproxy": {("post", "/v1/rail/submissions")},
        "railstub": {("post", "/submit")},
    }[role]
    assert expected <= operations
