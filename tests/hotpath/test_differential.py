"""Decision 17's differential test: every hot route, plain view against its DRF class.

Each row builds its own fresh state (session, key, payout) on one arm and sends one request;
it runs once against the live stack's roles (plain views, dlock.hotview) and once against a
process of the same role on tests.hotpath.reference_urls (the DRF classes), same database, same
settings. Status, every response header but Date/Server, and the body text must be equal once
the values that legitimately differ are masked (traceId, ids, timestamps, proofs, lock tokens).
Afterwards: refused requests wrote nothing, and every account's balance is its ledger sum.
"""

from __future__ import annotations

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

from devstack import RoleProcess, free_port
from dlock import proof
from tests import credentials

pytestmark = pytest.mark.live

TIMEOUT = 15
OWNER = "w-diff"
HOT_ROLES = ("lockserver", "payments", "railproxy")
IGNORED_HEADERS = {"date", "server", "content-length", "connection", "keep-alive"}
_MASKS = [
    (re.compile(r'"traceId":"[^"]*"'), '"traceId":"<trace>"'),
    (re.compile(r'"fencingToken":\d+'), '"fencingToken":"<token>"'),
    (re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.I), "<uuid>"),
    (re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z"), "<time>"),
    (re.compile(r"v1\.[A-Za-z0-9_\-]+\.[A-Za-z0-9_\-]{43}"), "<proof>"),
    (re.compile(r"acct-[0-9a-f]{16}"), "<account>"),
    (re.compile(r"ben-[0-9a-f]{12}"), "<beneficiary>"),  # payments.seeding's, per payout
    (re.compile(r"diff\.[0-9a-f]{12}"), "<key>"),
    (re.compile(r"rail-[A-Za-z0-9\-]+"), "<railref>"),
    (re.compile(r"RR-[0-9A-F]{20}"), "<railref>"),
]


def normalized(text: str) -> str:
    for pattern, mask in _MASKS:
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
    "release unknown kid": lambda a: release(a, headers={"X-Fencing-Proof": "v1.zz." + "A" * 43}),
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
    hot = Arm(
        "hot", {r: live_stack.url(r) for r in HOT_ROLES}, accounts[0], owned[accounts[0]], pay_url
    )
    ref = Arm(
        "ref", {r: p.url for r, p in references.items()}, accounts[1], owned[accounts[1]], pay_url
    )
    yield hot, ref
    for process in references.values():
        process.stop()


def assert_same(hot: requests.Response, ref: requests.Response) -> None:
    assert hot.status_code == ref.status_code, (hot.text, ref.text)
    hot_headers = {k.lower(): v for k, v in hot.headers.items() if k.lower() not in IGNORED_HEADERS}
    ref_headers = {k.lower(): v for k, v in ref.headers.items() if k.lower() not in IGNORED_HEADERS}
    assert hot_headers == ref_headers
    assert normalized(hot.text) == normalized(ref.text)
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
    from tests.hotpath.routes import hot_routes

    names = hot_routes(lock_routes.urlpatterns + pay_routes.urlpatterns + rail_routes.urlpatterns)
    assert sorted(names) == sorted(
        ["lock-acquire", "lock-renew", "lock", "payout-claim", "payout-post", "rail-submissions"]
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
        "payments": {("post", "/v1/payouts/{payout_id}/claim")},
        "railproxy": {("post", "/v1/rail/submissions")},
    }[role]
    assert expected <= operations
