"""Raw SQL of the PostgreSQL lock backend, one named function per statement.

Why not the ORM: every decision here is a single conditional statement whose predicate reads the
database clock (`clock_timestamp()`) and whose RETURNING row (or its absence) decides who won;
the ORM can express neither `nextval()` under the key's row lock nor ON CONFLICT … WHERE.

Grant liveness is row-local (`fencing_token`, `expires_at`, `session_expires_at` of one
`lock_grant` row), so PostgreSQL's re-check of a row after waiting for its lock (READ COMMITTED)
sees exactly the facts that decide, never a stale snapshot of another table.

`cursor` is a Django cursor on `connections[alias_for("lockserver")]`, or a psycopg cursor.

One module per concern: `common` (the shared fragments, the NOTIFY channels, the rows read
back), `sessions`, `acquire` (acquire, rotate, renew, key state), `release` (release with the
hand-off, hand-off, withdraw, revoke), `waiters` (the queue), `housekeeping` (reaper, purge,
counts). Callers use this package's names (`pg_sql.ACQUIRE_SQL`, `pg_sql.release`).
"""

from __future__ import annotations

from lockserver.backends.pg_sql.acquire import (
    ACQUIRE_SQL,
    KEY_STATE_SQL,
    RENEW_SQL,
    ROTATE_SQL,
    Acquired,
    key_state,
    renew,
    rotate,
    try_acquire,
)
from lockserver.backends.pg_sql.common import (
    _ELIGIBLE,
    _EPOCH_US,
    _FREE_HOLDER,
    _GRANT_PAYLOAD,
    _HANDED,
    _HEAD,
    _LIVE,
    _NOTIFY_GRANTED,
    _NOTIFY_IF_WAITED,
    _RECORD_HANDOFF,
    GRANT_CHANNEL,
    NOTIFY_CHANNEL,
    GrantRow,
    KeyState,
    SessionRow,
    grant_payload,
)
from lockserver.backends.pg_sql.housekeeping import (
    LIVE_COUNTS_SQL,
    PURGE_SQL,
    REAP_GRANTS_SQL,
    REAP_SESSIONS_SQL,
    in_recovery,
    live_counts,
    purge,
    reap_expired_sessions,
    reap_lapsed_grants,
)
from lockserver.backends.pg_sql.release import (
    HAND_OFF_SQL,
    LOCK_KEY_SQL,
    OWN_GRANT_SQL,
    RELEASE_SQL,
    REVOKE_SQL,
    WITHDRAW_SQL,
    HandOff,
    Released,
    hand_off,
    lock_key_row,
    release,
    revoke,
    withdraw,
)
from lockserver.backends.pg_sql.sessions import (
    DELETE_SESSION_SQL,
    DELETE_SESSION_WAITERS_SQL,
    GET_SESSION_SQL,
    HEARTBEAT_GRANTS_SQL,
    HEARTBEAT_SESSION_SQL,
    OPEN_SESSION_SQL,
    RELEASE_SESSION_GRANTS_SQL,
    delete_session,
    delete_session_waiters,
    get_session,
    heartbeat,
    open_session,
)
from lockserver.backends.pg_sql.waiters import (
    ADD_WAITER_SQL,
    add_waiter,
    remove_waiter,
)

__all__ = [
    "NOTIFY_CHANNEL",
    "GRANT_CHANNEL",
    "_LIVE",
    "_FREE_HOLDER",
    "_NOTIFY_IF_WAITED",
    "_ELIGIBLE",
    "_HEAD",
    "_HANDED",
    "_RECORD_HANDOFF",
    "_EPOCH_US",
    "_NOTIFY_GRANTED",
    "_GRANT_PAYLOAD",
    "grant_payload",
    "SessionRow",
    "GrantRow",
    "KeyState",
    "OPEN_SESSION_SQL",
    "open_session",
    "GET_SESSION_SQL",
    "get_session",
    "HEARTBEAT_SESSION_SQL",
    "HEARTBEAT_GRANTS_SQL",
    "heartbeat",
    "DELETE_SESSION_SQL",
    "RELEASE_SESSION_GRANTS_SQL",
    "DELETE_SESSION_WAITERS_SQL",
    "delete_session_waiters",
    "delete_session",
    "ACQUIRE_SQL",
    "Acquired",
    "try_acquire",
    "ROTATE_SQL",
    "rotate",
    "KEY_STATE_SQL",
    "key_state",
    "RENEW_SQL",
    "renew",
    "RELEASE_SQL",
    "Released",
    "release",
    "HAND_OFF_SQL",
    "HandOff",
    "hand_off",
    "WITHDRAW_SQL",
    "OWN_GRANT_SQL",
    "withdraw",
    "LOCK_KEY_SQL",
    "REVOKE_SQL",
    "lock_key_row",
    "revoke",
    "ADD_WAITER_SQL",
    "add_waiter",
    "remove_waiter",
    "REAP_GRANTS_SQL",
    "reap_lapsed_grants",
    "REAP_SESSIONS_SQL",
    "reap_expired_sessions",
    "PURGE_SQL",
    "purge",
    "LIVE_COUNTS_SQL",
    "live_counts",
    "in_recovery",
]
