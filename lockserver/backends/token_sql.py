"""The deployment's token continuity in lockdb, for both backends: pg's sequence floor and the
`lock_token_high_water` row (one named function per statement).

Why not the ORM: `setval` under an advisory lock and a `GREATEST` upsert are single statements
whose returned row is the answer; the etcd backend also calls these on a psycopg connection of
its own, outside Django's pool. `cursor` is a Django or psycopg cursor on lockdb.
"""

from __future__ import annotations

from typing import Any

# Serialises floor appliers (two lock-servers starting together): the second one reads the
# sequence after the first one's setval, so it can never move the sequence backwards.
FLOOR_LOCK_SQL = "SELECT pg_advisory_xact_lock(hashtext('fencing_token_seq floor'))"
APPLY_FLOOR_SQL = """
SELECT CASE WHEN (CASE WHEN is_called THEN last_value ELSE last_value - 1 END) < %(floor)s
            THEN setval('fencing_token_seq', %(floor)s, true)
            ELSE last_value END
FROM fencing_token_seq
"""


def apply_token_floor(cursor: Any, *, floor: int) -> int:
    """Advance fencing_token_seq so the next token is > floor; never moves it backwards.

    Call inside one transaction. Returns the sequence's last value afterwards.
    """
    cursor.execute(FLOOR_LOCK_SQL)
    cursor.execute(APPLY_FLOOR_SQL, {"floor": floor})
    return int(cursor.fetchone()[0])


# 0 when the table or the sequence does not exist yet (a lockdb migrated before 0003).
READ_HIGH_WATER_SQL = """
SELECT COALESCE((SELECT token FROM lock_token_high_water WHERE id = 1), 0),
       COALESCE((SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END
                 FROM fencing_token_seq), 0)
"""


def read_high_water(cursor: Any) -> tuple[int, int]:
    """(the high-water row, pg's last token): every token this deployment issued is ≤ max."""
    cursor.execute(READ_HIGH_WATER_SQL)
    row, sequence = cursor.fetchone()
    return int(row), int(sequence)


RAISE_HIGH_WATER_SQL = """
INSERT INTO lock_token_high_water AS h (id, token, backend, updated_at)
VALUES (1, %(token)s, %(backend)s, clock_timestamp())
ON CONFLICT (id) DO UPDATE SET token = GREATEST(h.token, EXCLUDED.token),
    backend = CASE WHEN EXCLUDED.token > h.token THEN EXCLUDED.backend ELSE h.backend END,
    updated_at = clock_timestamp()
RETURNING token
"""


def raise_high_water(cursor: Any, *, token: int, backend: str) -> int:
    """Raise the row to at least `token` (GREATEST, never lowered); the row's value after."""
    cursor.execute(RAISE_HIGH_WATER_SQL, {"token": token, "backend": backend})
    return int(cursor.fetchone()[0])


# pg: the row follows the sequence (housekeeping); nextval() is WAL-logged before it returns,
# so the sequence itself is always ≥ every pg token, and the row catches up within a tick.
_SEQUENCE_LAST = (
    "(SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END FROM fencing_token_seq)"
)
MIRROR_SEQUENCE_SQL = f"""
UPDATE lock_token_high_water
SET token = {_SEQUENCE_LAST}, backend = 'pg', updated_at = clock_timestamp()
WHERE id = 1 AND token < {_SEQUENCE_LAST}
"""


def mirror_sequence(cursor: Any) -> None:
    cursor.execute(MIRROR_SEQUENCE_SQL)
