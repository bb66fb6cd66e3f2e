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
counts). Callers import each name from its module (`pg_sql.release.RELEASE_SQL`); this package
re-exports nothing.
"""
