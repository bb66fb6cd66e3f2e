"""The waiter queue: admit a waiter, marking the key's row (release.withdraw removes it)."""

from __future__ import annotations

import uuid
from typing import Any

from lockserver.backends.pg_sql.common import LIVE

# Soft cap: two waiters racing for the last slot may both get in (the count is a snapshot).
# Admitted only for a live session (owned by owner_id when given) that does not hold the key
# itself; else nothing is written and the caller reads why (get_session, key_state). An admitted
# waiter also marks the key's row (waiter_until, see NOTIFY_IF_WAITED) and reads back from the
# newest row version whether the key is still held and when its holder lapses: if a freeing
# statement held the row meanwhile, it may not have seen this entry, so the caller hands the
# key over itself (hand_off) instead of parking.
# Its commit does not wait for the WAL flush (synchronous_commit off for this statement's own
# transaction only: set_config(..., true)): a queue entry grants nothing, and on a hot key its
# flush would otherwise sit between the next release and that release's own flush. Durability
# holds: every grant is made by a synchronous statement (release, hand_off, revoke, close), and
# one that read this entry flushes the WAL up to its own record, this entry's included (the WAL
# is flushed in order). A crash can lose only the newest entries; their parked acquires are woken
# when the listener reconnects and, found in no queue, answer when their wait runs out.
ADD_WAITER_SQL = f"""
WITH sess AS (
    SELECT session_id, owner_id FROM lock_session
    WHERE session_id = %(session_id)s AND expires_at > clock_timestamp()
      AND (%(owner_id)s::text IS NULL OR owner_id = %(owner_id)s::text)
), ins AS (
    INSERT INTO lock_waiter (waiter_id, lock_key, session_id, owner_id, ttl_ms, since,
                             expires_at)
    SELECT %(waiter_id)s, %(key)s::varchar, sess.session_id, sess.owner_id, %(ttl_ms)s,
           clock_timestamp(), clock_timestamp() + %(wait_ms)s * interval '1 millisecond'
    FROM sess
    WHERE (SELECT count(*) FROM lock_waiter
           WHERE lock_key = %(key)s::varchar AND expires_at > clock_timestamp()) < %(cap)s
      AND NOT EXISTS (SELECT 1 FROM lock_grant AS g
                      WHERE g.lock_key = %(key)s::varchar AND g.session_id = sess.session_id
                        AND {LIVE})
    RETURNING expires_at
), mark AS (
    UPDATE lock_grant AS g
    SET waiter_until = GREATEST(g.waiter_until, (SELECT expires_at FROM ins))
    WHERE g.lock_key = %(key)s::varchar AND EXISTS (SELECT 1 FROM ins)
    RETURNING {LIVE} AS held,
              CEIL(EXTRACT(EPOCH FROM (LEAST(g.expires_at, g.session_expires_at)
                                       - clock_timestamp())) * 1000)::bigint AS ms
)
SELECT EXISTS (SELECT 1 FROM ins), COALESCE((SELECT held FROM mark), false),
       (SELECT ms FROM mark)
FROM (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit
"""


def add_waiter(
    cursor: Any,
    *,
    waiter_id: uuid.UUID,
    key: str,
    session_id: uuid.UUID,
    owner_id: str | None,
    wait_ms: int,
    cap: int,
    ttl_ms: int = 30_000,
) -> tuple[bool, bool, int | None]:
    """Queue a waiter if its session may and the key's cap allows: (admitted, the key still
    held, ms until its holder lapses). Not held means the key was freed while we marked it:
    hand it over (hand_off) rather than wait for a NOTIFY. `ttl_ms` is the grant's ttlMillis
    should the key be handed to this waiter."""
    cursor.execute(
        ADD_WAITER_SQL,
        {
            "waiter_id": waiter_id,
            "key": key,
            "session_id": session_id,
            "owner_id": owner_id,
            "wait_ms": wait_ms,
            "cap": cap,
            "ttl_ms": ttl_ms,
        },
    )
    admitted, held, ms = cursor.fetchone()
    return bool(admitted), bool(held), None if ms is None else max(0, int(ms))
