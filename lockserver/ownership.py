"""Which caller credential opened a session (CHANGELOG row 47): only it may heartbeat (L2),
close (L3), acquire on (L4), renew on (L5) or release through (L6) that session.

Kept beside the backends, not inside them. On pg the record lives in lockdb (CHANGELOG row 31),
written right after L1 created the session and before its id is returned, so no caller can know
the id before its owner is recorded. On etcd the credential is part of the
session's own record, written by the put that creates the session, so sessions never need lockdb
there; the lockdb row is still written when lockdb answers (replicas of an older release read
it) and read only for a session whose etcd record has no credential (opened by an older
release). A session without any record is judged by the backend alone. Raw SQL: a two-column
side table the backends' models do not know.
"""

from __future__ import annotations

import logging
import uuid

from django.db import DatabaseError, connections

from dlock.auth import Principal
from dlock.dbrouter import alias_for
from dlock.errors import ApiError, Code
from dlock.memo import WriteOnceMap
from lockserver.backends import get_backend

logger = logging.getLogger("dlock.lockserver")

_RECORD = (
    "INSERT INTO lock_session_credential (session_id, credential_id) VALUES (%s, %s) "
    "ON CONFLICT (session_id) DO NOTHING"
)
_OWNER = "SELECT credential_id FROM lock_session_credential WHERE session_id = %s"
# A session's owner is written once (ON CONFLICT DO NOTHING) and never changes: kept per process,
# so L2/L4/L5/L6 skip this round trip (and a pool checkout) after a session's first call here.
_owners = WriteOnceMap()


def _in_store() -> bool:
    """The backend keeps each session's credential itself (etcd)."""
    return bool(getattr(get_backend(), "records_session_credential", False))


def record_owner(*, session_id: uuid.UUID, principal: Principal) -> None:
    if not _in_store():
        with connections[alias_for("lockserver")].cursor() as cursor:
            cursor.execute(_RECORD, [session_id, principal.credential_id])
        return
    _owners.remember(session_id, principal.credential_id)
    try:  # for replicas of an older release only: the session's record already holds it
        with connections[alias_for("lockserver")].cursor() as cursor:
            cursor.execute(_RECORD, [session_id, principal.credential_id])
    except DatabaseError:
        logger.info("lockdb unreachable: session %s owner kept in etcd only", session_id)


def check_owner(*, session_id: uuid.UUID, principal: Principal) -> None:
    """FORBIDDEN when another credential opened `session_id`."""
    owner = _owners.get_or_read(session_id, _read_owner)
    if owner is not None and owner != principal.credential_id:
        raise ApiError(Code.FORBIDDEN, "this session belongs to another credential")


def _read_owner(session_id: uuid.UUID) -> str | None:
    if _in_store():
        known, credential = get_backend().session_credential(session_id)  # type: ignore[attr-defined]
        if credential is not None or not known:
            return credential  # an unknown session: the backend answers SESSION_UNKNOWN
    connection = connections[alias_for("lockserver")]
    with connection.cursor() as cursor:
        cursor.execute(_OWNER, [session_id])
        row = cursor.fetchone()
    if not connection.in_atomic_block:
        # Back to the pool now: an acquire that then parks in a waitMillis wait (etcd) must not
        # hold a lockdb slot for its whole wait, or parked waiters starve session opens.
        connection.close()
    return row[0] if row else None
