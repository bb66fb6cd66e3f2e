"""A bench-only WSGI app: the L1/L4/L6 happy path with no Django, DRF or middleware.

It answers exactly the requests `bench.lockserver`'s HTTP clients send (create a session, then
loop acquire + release on an uncontended key) with the same SQL (`lockserver.backends.pg_sql`)
over a psycopg pool, under the same gunicorn config as the real lock server. It validates nothing,
logs nothing, counts nothing and handles no error: it is NOT a lock server, only the floor —
what gunicorn + psycopg + the SQL cost on this machine — so the benchmark can show how much of
the gap to direct SQL the framework stack is, and whether the goal is reachable at all here.

    gunicorn -c settings/gunicorn.py bench.floor_app    (FLOOR_DATABASE_URL=postgres://...)
"""

from __future__ import annotations

import json
import os
import uuid

from psycopg_pool import ConnectionPool

from dlock import proof
from lockserver.backends.pg_sql import acquire as acquire_sql
from lockserver.backends.pg_sql import release as release_sql
from lockserver.backends.pg_sql import sessions as sessions_sql

# The grant's proof is signed as the lock server signs it (decision 15): part of L4's cost.
_RING = proof.parse_key_ring(os.environ["DLOCK_PROOF_KEYS"])

_pool = ConnectionPool(
    os.environ["FLOOR_DATABASE_URL"],
    min_size=1,
    max_size=int(os.environ.get("DB_POOL_MAX", "8")),
    kwargs={"autocommit": True},
    open=True,
)
_JSON = [("Content-Type", "application/json; charset=utf-8")]


def _answer(start_response, status: str, body: dict | None):
    if body is None:
        start_response(status, [("Content-Length", "0")])
        return [b""]
    raw = json.dumps(body, separators=(",", ":")).encode()
    start_response(status, [*_JSON, ("Content-Length", str(len(raw)))])
    return [raw]


def application(environ, start_response):
    method, path = environ["REQUEST_METHOD"], environ["PATH_INFO"]
    if path == "/health/ready":  # what devstack.RoleProcess waits for
        return _answer(start_response, "200 OK", {"status": "UP"})
    length = int(environ.get("CONTENT_LENGTH") or 0)
    body = json.loads(environ["wsgi.input"].read(length)) if length else {}
    owner = environ.get("HTTP_X_OWNER_ID") or body.get("ownerId") or "floor"
    with _pool.connection() as conn, conn.cursor() as cursor:
        if method == "POST" and path == "/v1/sessions":
            session_id = uuid.uuid4()
            sessions_sql.open_session(
                cursor, session_id=session_id, owner_id=owner, ttl_ms=body["ttlMillis"]
            )
            return _answer(start_response, "201 Created", {"sessionId": str(session_id)})
        key = path.removeprefix("/v1/locks/").removesuffix("/acquire")
        if method == "POST":
            acquired = acquire_sql.try_acquire(
                cursor,
                key=key,
                session_id=uuid.UUID(body["sessionId"]),
                owner_id=owner,
                ttl_ms=10_000,
            )
            assert acquired is not None, "the floor app serves uncontended keys only"
            grant = acquired.grant
            signed = proof.sign(key=key, token=grant.fencing_token, ring=_RING)
            return _answer(
                start_response,
                "200 OK",
                {"fencingToken": grant.fencing_token, "fencingProof": signed},
            )
        token = int(environ["HTTP_X_FENCING_TOKEN"])
        assert release_sql.release(cursor, key=key, token=token) is not None
        return _answer(start_response, "204 No Content", None)
