"""The pg backend's housekeeper (the listener thread runs it, on its own connection): lapsed grants
reaped and handed to their queues, expired sessions logged, retention, token mirror, gauges.
"""

from __future__ import annotations

from collections.abc import Callable

import psycopg
from django.conf import settings

from dlock.logs import log_event
from dlock.metrics import lock_live_grants, lock_live_sessions
from dlock.timefmt import rfc3339_ms
from lockserver.backends import token_sql
from lockserver.backends.pg_sql import housekeeping as housekeeping_sql
from lockserver.backends.pg_sql import release as release_sql


class Housekeeper:
    """One pass per LOCK_HOUSEKEEPING_MS (KeyListener calls `run`)."""

    def __init__(self, *, backend: str) -> None:
        self.backend = backend

    def run(self, conn: psycopg.Connection, wake: Callable[[str], None]) -> None:
        """Reap, log, purge, mirror and count. `wake` (KeyListener.hand_over) is called with
        each hand-off's grant payload once the hand-offs have committed: a waiter of this
        process granted by a lapse answers without waiting for the NOTIFY."""
        with conn.cursor() as cursor:
            with conn.transaction():
                lapsed = housekeeping_sql.reap_lapsed_grants(cursor)
                # A lapse hands over too (decision 23): every reaped key some waiter may be
                # queued on, in one statement.
                waited = [key for key, _token, _owner, _session, was_waited in lapsed if was_waited]
                handed = release_sql.hand_off_keys(cursor, keys=waited)
            for payload in handed:
                wake(payload)
            for key, token, owner, session_id, _waited in lapsed:
                log_event(
                    "lock_expired",
                    backend=self.backend,
                    key=key,
                    fencingToken=token,
                    ownerId=owner,
                    sessionId=str(session_id),
                )
            for session_id, owner, expired_at in housekeeping_sql.reap_expired_sessions(cursor):
                log_event(
                    "session_expired",
                    backend=self.backend,
                    sessionId=str(session_id),
                    ownerId=owner,
                    expiredAt=rfc3339_ms(expired_at),
                )
            housekeeping_sql.purge(cursor, retention_ms=settings.LOCK_SESSION_RETENTION_MS)
            token_sql.mirror_sequence(cursor)
            sessions, grants = housekeeping_sql.live_counts(cursor)
        lock_live_sessions.labels(backend=self.backend).set(sessions)
        lock_live_grants.labels(backend=self.backend).set(grants)
