"""Bench-only WSGI apps: a payout's happy path on payments, rail proxy and rail stub with no
Django request handling, DRF, middleware, logs or metrics (issue 18's payout floor).

The lock server's floor is `bench.floor_app` (L1/L4/L6). This module serves the other three
roles, picked by ROLE as gunicorn's config picks their threads, and sends per request the
statements the role sends, through the role's own named SQL functions on a psycopg pool
(autocommit, `prepare_threshold=1` as `settings/base.py` sets it; a transaction is BEGIN …
COMMIT as under `transaction.atomic`):

* payments P2 claim: the payout's account read (first sight, as `payments.proofs` keeps it),
  proof check; BEGIN, identity lock, `record_or_fence`, `claim_check`, `claim_transition`
  (transition + event + record), COMMIT.
* payments P3 post: proof check; BEGIN, identity lock, `record_or_fence`, `post` (one posting
  statement), COMMIT.
* rail proxy submission: the payout's account read (first sight), proof check; admission
  (BEGIN, identity lock, `replay_or_payout`, `advance_high_water`, `live_submission`,
  `transition_payout` → SUBMITTING, `insert_submission`, COMMIT); the rail call on a fresh
  connection (`Connection: close`, never pooled) to the stub; recording (BEGIN,
  `resolve_submission`, `transition_payout` → RAIL_ACKED, COMMIT).
* rail stub `POST /submit`: the config row (`CONFIG_SQL`), then the booking and the request log
  in one statement (`BOOK_AND_LOG_SQL`).

Django is set up once at import (the SQL modules import the models for their state names); no
request goes through it. It validates nothing beyond what the SQL decides and handles no error:
NOT a server, only what gunicorn + psycopg + the same SQL cost per payout on this machine.

    ROLE=payments gunicorn -c settings/gunicorn.py bench.floor_payout
"""

from __future__ import annotations

import http.client
import json
import os
import uuid
from urllib.parse import urlsplit

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "settings.tooling")
django.setup()

from django.conf import settings  # noqa: E402 - after django.setup()
from psycopg_pool import ConnectionPool  # noqa: E402

from dlock import idempotency  # noqa: E402
from dlock.fence.proofs import PublicKeys, Verifier  # noqa: E402
from dlock.timefmt import rfc3339_ms, utcnow  # noqa: E402
from payments.fenced_sql import claim as claim_sql  # noqa: E402
from payments.fenced_sql import fences as fences_sql  # noqa: E402
from payments.fenced_sql import payout as payout_sql  # noqa: E402
from payments.fenced_sql import post as post_sql  # noqa: E402
from payments.proofs import ACCOUNT_OF_PAYOUT_SQL  # noqa: E402
from railproxy import fenced_sql as rail_sql  # noqa: E402
from railstub import services as stub  # noqa: E402

ROLE = os.environ["ROLE"]
_DB_ENV = {"payments": "PAY_DATABASE_URL", "railproxy": "PAY_DATABASE_URL"}
_pool = ConnectionPool(
    os.environ[_DB_ENV.get(ROLE, "RAIL_DATABASE_URL")],
    min_size=1,
    max_size=int(os.environ.get("DB_POOL_MAX", "8")),
    kwargs={
        "autocommit": True,
        "prepare_threshold": 1,
        # As settings/railstub.py: the stub's books commit without waiting for the flush.
        **({"options": "-c synchronous_commit=off"} if ROLE == "railstub" else {}),
    },
    open=True,
)
# The verifiers hold public keys only (decision 25); the kit's verifier, as payments and the
# rail proxy use it (its memory of verified proofs included).
_VERIFIER = Verifier(PublicKeys.parse(os.environ.get("DLOCK_FENCING_PUBLIC_KEYS", "")))
_RAIL = urlsplit(os.environ.get("FLOOR_RAIL_URL", "http://127.0.0.1:1"))
_JSON = [("Content-Type", "application/json; charset=utf-8")]
_accounts: dict[uuid.UUID, str] = {}  # payout → account, read once per process (payments.proofs)


def _answer(start_response, status: str, body: dict):
    raw = json.dumps(body, separators=(",", ":")).encode()
    start_response(status, [*_JSON, ("Content-Length", str(len(raw)))])
    return [raw]


def _body(environ) -> dict:
    length = int(environ.get("CONTENT_LENGTH") or 0)
    return json.loads(environ["wsgi.input"].read(length)) if length else {}


def _check_proof(cursor, environ, payout_id: uuid.UUID, token: int) -> str:
    """The payout's account (read the first time), and the proof must be for it and `token`."""
    account = _accounts.get(payout_id)
    if account is None and ROLE == "railproxy":  # railproxy.proofs reads it through the selector
        stored = rail_sql.payout(cursor, payout_id=payout_id)
        account = _accounts.setdefault(payout_id, stored.account_id)
    elif account is None:  # payments.proofs
        cursor.execute(ACCOUNT_OF_PAYOUT_SQL, [payout_id])
        account = _accounts.setdefault(payout_id, cursor.fetchone()[0])
    _VERIFIER.verify(environ.get("HTTP_X_FENCING_PROOF"), key=f"payout:{account}", token=token)
    return account


def _claim(conn, environ, payout_id: uuid.UUID) -> dict:
    token, key = int(environ["HTTP_X_FENCING_TOKEN"]), environ["HTTP_X_IDEMPOTENCY_KEY"]
    owner = environ.get("HTTP_X_OWNER_ID", "floor")
    body = _body(environ)
    request_hash = idempotency.request_hash(
        {"operation": "claim", "payoutId": str(payout_id), "body": body}
    )
    with conn.cursor() as cursor:
        _check_proof(cursor, environ, payout_id, token)
        with conn.transaction():
            idempotency.lock_identity(cursor, operation="claim", key=key, token=token)
            step = fences_sql.record_or_fence(
                cursor, operation="claim", payout_id=payout_id, token=token, idempotency_key=key
            )
            assert step.account is not None, "the floor serves fresh, unfenced claims only"
            check = claim_sql.claim_check(cursor, payout_id=payout_id)
            answer = {
                "payoutId": str(payout_id),
                "state": "CLAIMED",
                "claimToken": token,
                "accountFence": step.account.fence,
                "attemptCount": check.attempt_count + 1,
                "idempotencyKey": key,
                "beneficiaryRef": check.beneficiary_ref,
            }
            assert claim_sql.claim_transition(
                cursor,
                payout_id=payout_id,
                expected_state=body["expectedState"],
                token=token,
                owner_id=owner,
                idempotency_key=key,
                request_hash=request_hash,
                body_json=json.dumps(answer, separators=(",", ":")),
            )
    return answer


def _post(conn, environ, payout_id: uuid.UUID) -> dict:
    token, key = int(environ["HTTP_X_FENCING_TOKEN"]), environ["HTTP_X_IDEMPOTENCY_KEY"]
    body = _body(environ)
    request_hash = idempotency.request_hash(
        {
            "operation": "post",
            "payoutId": str(payout_id),
            "body": {"railReference": body["railReference"], "submissionId": body["submissionId"]},
        }
    )
    debit, credit = uuid.uuid4(), uuid.uuid4()
    with conn.cursor() as cursor:
        _check_proof(cursor, environ, payout_id, token)
        with conn.transaction():
            idempotency.lock_identity(cursor, operation="post", key=key, token=token)
            step = fences_sql.record_or_fence(
                cursor, operation="post", payout_id=payout_id, token=token, idempotency_key=key
            )
            assert step.account is not None, "the floor serves fresh posts only"
            amount = step.account.payout_amount_minor
            leg = {"amountMinor": amount, "fence": token}
            answer = {
                "payoutId": str(payout_id),
                "state": "POSTED",
                "entries": [
                    {"entryId": str(debit), "direction": "DEBIT", **leg},
                    {"entryId": str(credit), "direction": "CREDIT", **leg},
                ],
                "balanceMinor": step.account.balance_minor - amount,
            }
            posted = post_sql.post(
                cursor,
                payout_id=payout_id,
                token=token,
                owner_id=environ.get("HTTP_X_OWNER_ID", "floor"),
                rail_reference=body["railReference"],
                submission_id=uuid.UUID(body["submissionId"]),
                debit_entry=debit,
                credit_entry=credit,
                idempotency_key=key,
                request_hash=request_hash,
                body_json=json.dumps(answer, separators=(",", ":")),
                settlement_bucket=post_sql.settlement_bucket(
                    payout_id, buckets=settings.PAY_SETTLEMENT_BUCKETS
                ),
            )
            assert posted is not None, "the floor serves RAIL_ACKED payouts only"
    return answer


def _call_rail(payout_id: uuid.UUID, body: dict) -> dict:
    """The rail call: a fresh connection, one request, closed (never pooled), as rail_call does."""
    rail = http.client.HTTPConnection(_RAIL.hostname, _RAIL.port, timeout=8)
    try:
        raw = json.dumps(
            {
                "clientRef": str(payout_id),
                "amountMinor": body["amountMinor"],
                "currency": body["currency"],
            },
            separators=(",", ":"),
        )
        rail.request(
            "POST",
            "/submit",
            body=raw,
            headers={"Content-Type": "application/json", "Connection": "close"},
        )
        response = rail.getresponse()
        return json.loads(response.read())
    finally:
        rail.close()


def _submit(environ) -> dict:
    token, key = int(environ["HTTP_X_FENCING_TOKEN"]), environ["HTTP_X_IDEMPOTENCY_KEY"]
    owner = environ.get("HTTP_X_OWNER_ID", "floor")
    body = _body(environ)
    payout_id = uuid.UUID(body["payoutId"])
    request_hash = idempotency.request_hash(
        {k: body[k] for k in ("payoutId", "accountId", "amountMinor", "currency", "beneficiaryRef")}
    )
    submission_id = uuid.uuid4()
    with _pool.connection() as conn, conn.cursor() as cursor:  # admission
        account = _check_proof(cursor, environ, payout_id, token)
        with conn.transaction():
            idempotency.lock_identity(cursor, operation="rail", key=key, token=token)
            step = rail_sql.replay_or_payout(cursor, key=key, token=token, payout_id=payout_id)
            assert step.payout is not None and step.payout.state == "CLAIMED"
            assert rail_sql.advance_high_water(
                cursor, account_id=account, token=token, payout_id=payout_id
            )
            assert rail_sql.live_submission(cursor, payout_id=payout_id) is None
            assert payout_sql.transition_payout(
                cursor,
                payout_id=payout_id,
                from_states=("CLAIMED",),
                to_state="SUBMITTING",
                token=token,
                owner_id=owner,
                note=f"rail submission {submission_id}",
            )
            rail_sql.insert_submission(
                cursor,
                submission_id=submission_id,
                payout_id=payout_id,
                account_id=account,
                amount_minor=body["amountMinor"],
                currency=body["currency"],
                token=token,
                owner_id=owner,
                key=key,
                request_hash=request_hash,
                client_ref=str(payout_id),
                outcome="PENDING",
            )
    ack = _call_rail(payout_id, body)
    answer = {
        "submissionId": str(submission_id),
        "payoutId": str(payout_id),
        "presentedToken": token,
        "outcome": "ACKED",
        "railReference": ack["railReference"],
        "submittedAt": None,
        "resolvedAt": None,
    }
    with _pool.connection() as conn, conn.cursor() as cursor, conn.transaction():  # recording
        stamps = rail_sql.resolve_submission(
            cursor,
            submission_id=submission_id,
            outcome="ACKED",
            detail="acked",
            rail_reference=ack["railReference"],
            response_status=200,
            response_body=answer,
            stamped=True,
        )
        assert stamps is not None
        assert payout_sql.transition_payout(
            cursor,
            payout_id=payout_id,
            from_states=("SUBMITTING",),
            to_state="RAIL_ACKED",
            token=token,
            owner_id=owner,
            note=f"rail acked (acked) {submission_id}",
        )
    answer["submittedAt"], answer["resolvedAt"] = rfc3339_ms(stamps[0]), rfc3339_ms(stamps[1])
    return answer


def _book(environ) -> dict:
    body = _body(environ)
    reference = stub.new_reference()
    accepted_at = utcnow()
    with _pool.connection() as conn, conn.cursor() as cursor:
        cursor.execute(stub.CONFIG_SQL)
        cursor.fetchone()  # read per request, as the stub does (rates may change while running)
        cursor.execute(
            stub.BOOK_AND_LOG_SQL[False],
            {
                "client_ref": body["clientRef"],
                "amount_minor": body["amountMinor"],
                "currency": body["currency"],
                "fault": "ok",
                "reference": reference,
                "accepted_at": accepted_at,
                "received_at": utcnow(),
            },
        )
    return {"railReference": reference, "acceptedAt": rfc3339_ms(accepted_at)}


def application(environ, start_response):
    path = environ["PATH_INFO"]
    if path == "/health/ready":  # what devstack.RoleProcess waits for
        return _answer(start_response, "200 OK", {"status": "UP"})
    if ROLE == "railstub":
        return _answer(start_response, "200 OK", _book(environ))
    if ROLE == "railproxy":
        return _answer(start_response, "200 OK", _submit(environ))
    payout_id = uuid.UUID(path.split("/")[3])  # /v1/payouts/{id}/claim|post
    with _pool.connection() as conn:
        if path.endswith("/claim"):
            return _answer(start_response, "200 OK", _claim(conn, environ, payout_id))
        return _answer(start_response, "200 OK", _post(conn, environ, payout_id))
