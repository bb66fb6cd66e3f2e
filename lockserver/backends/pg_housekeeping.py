"""The pg backend's housekeeping (the listener thread calls it, on its own connection): lapsed
grants reaped and handed to their queues, expired sessions logged, retention, token mirror, gauges.
"""

from __future__ import annotations

from collections.abc import Callable

import psycopg
from django.conf import settings

from dlock.logs import log_event
from dlock.metrics import lock_live_grants, lock_live_sessions
from dlock.timefmt import rfc3339_ms
from lockserver.backends import pg_sql as sql
from lockserver.backends import token_sql


def housekeep(
    conn: psycopg.Connection,
    *,
    backend: str,
    hand_over: Callable[[str | None], None] | None = None,
) -> None:
    """Reaper (listener thread, own connection): expiry events, retention, gauges.
    `hand_over` wakes a waiter of this process granted by a lapse's hand-off, after the commit."""
    handed: list[str | None] = []
    with conn.cursor() as cursor:
        with conn.transaction():
            lapsed = sql.reap_lapsed_grants(cursor)
            for key, _token, _owner, _session_id, waited in lapsed:
                if waited:  # a lapse hands over too (decision 23)
                    handed.append(sql.hand_off(cursor, key=key).payload)
        if hand_over is not None:
            for payload in handed:
                hand_over(payload)
        for key, token, owner, session_id, _waited in lapsed:
            log_event(
                "lock_expired",
                backend=backend,
                key=key,
                fencingToken=token,
                ownerId=owner,
                sessionId=str(session_id),
            )
        for session_id, owner, expired_at in sql.reap_expired_sessions(cursor):
            log_event(
                "session_expired",
                backend=backend,
                sessionId=str(session_id),
                ownerId=owner,
                expiredAt=rfc3339_ms(expired_at),
            )
        sql.purge(cursor, retention_ms=settings.LOCK_SESSION_RETENTION_MS)
        token_sql.mirror_sequence(cursor)
        sessions, grants = sql.live_counts(cursor)
    lock_live_sessions.labels(backend=backend).set(sessions)
    lock_live_grants.labels(backend=backend).set(grants)
