"""The side-effect gate's two tables and their statements (dlock.fence.gate runs the protocol).

`HighWaterMark`: one row per resource, the highest token that reached the third party (step 1's
strict advance). `IntentLog`: one row per attempt; its live outcomes refuse a second attempt of
the same operation (step 2), the PENDING insert is step 3 and the conditional resolve is the
outcome's record. Both default to the tables of `GATE_SCHEMA_SQL`; rail-proxy configures them
on its own (`rail_high_water`, `rail_submission`). Table and column names are identifiers chosen
in code, never input.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

PENDING, SUCCEEDED, FAILED, NOT_SENT, AMBIGUOUS = (
    "PENDING",
    "SUCCEEDED",
    "FAILED",
    "NOT_SENT",
    "AMBIGUOUS",
)
# Attempts that reached (or may have reached) the third party: a second one is refused.
LIVE_OUTCOMES = (PENDING, SUCCEEDED, FAILED, AMBIGUOUS)

# The default tables SideEffectGate uses; create them once (a migration, or this script).
GATE_SCHEMA_SQL = """
CREATE TABLE IF NOT EXISTS fence_high_water (
    resource_id      text PRIMARY KEY,
    highest_token    bigint NOT NULL CHECK (highest_token > 0),
    retry_operation  text,
    updated_at       timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE IF NOT EXISTS fence_intent (
    intent_id     uuid PRIMARY KEY,
    operation_id  text NOT NULL,
    resource_id   text NOT NULL,
    token         bigint NOT NULL,
    owner_id      text NOT NULL,
    outcome       text NOT NULL,
    result        jsonb,
    created_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    resolved_at   timestamptz
);
CREATE UNIQUE INDEX IF NOT EXISTS fence_intent_one_live ON fence_intent (operation_id)
 WHERE outcome IN ('PENDING', 'SUCCEEDED', 'FAILED', 'AMBIGUOUS');
"""


def _name(name: str) -> str:
    if not name.replace("_", "").isalnum() or not name.isascii() or name[0].isdigit():
        raise ValueError(f"not an SQL identifier: {name!r}")
    return name


@dataclass(frozen=True)
class HighWaterMark:
    """Step 1's table: one row per resource, the highest token that reached the third party,
    and the one operation that may come back under that same token after a NOT_SENT attempt.
    `retry_type` casts the retry parameter (rail-proxy's payout ids are uuid)."""

    table: str = "fence_high_water"
    resource_column: str = "resource_id"
    token_column: str = "highest_token"  # noqa: S105 - a column name
    retry_column: str = "retry_operation"
    retry_type: str = "text"

    def __post_init__(self) -> None:
        for name in (self.table, self.resource_column, self.token_column, self.retry_column):
            _name(name)
        _name(self.retry_type)

    @property
    def advance_sql(self) -> str:
        """Strict advance, one statement: the resource's first admission creates its mark at
        this token (every token is > 0); the equality arm only re-admits the operation whose
        attempt under this very token ended NOT_SENT. No row back: fenced."""
        t, r, h, x = self.table, self.resource_column, self.token_column, self.retry_column
        return f"""
INSERT INTO {t} AS hw ({r}, {h}, {x}, updated_at)
VALUES (%(resource_id)s, %(token)s, NULL, clock_timestamp())
    ON CONFLICT ({r}) DO UPDATE
   SET {h} = EXCLUDED.{h}, {x} = NULL,
       updated_at = clock_timestamp()
 WHERE hw.{h} < EXCLUDED.{h}
    OR (hw.{h} = EXCLUDED.{h} AND hw.{x} = %(operation)s::{self.retry_type})
RETURNING {h}
"""

    @property
    def highest_sql(self) -> str:
        h, t, r = self.token_column, self.table, self.resource_column
        return f"SELECT {h} FROM {t} WHERE {r} = %(resource_id)s"

    @property
    def admits_sql(self) -> str:
        """Would `advance_sql` admit this token? Asked, row-locked, when a refusal is already
        known and must not move the mark."""
        h, x = self.token_column, self.retry_column
        return f"""
SELECT {h},
       {h} < %(token)s
       OR ({h} = %(token)s AND {x} = %(operation)s::{self.retry_type})
  FROM {self.table} WHERE {self.resource_column} = %(resource_id)s
   FOR UPDATE
"""

    @property
    def raise_floor_sql(self) -> str:
        """highest = GREATEST(highest, floor), creating the row (an operator's revoke push); a
        raised mark clears the same-token retry allowance (the floor came from a newer grant)."""
        t, r, h, x = self.table, self.resource_column, self.token_column, self.retry_column
        return f"""
INSERT INTO {t} ({r}, {h}, {x}, updated_at)
VALUES (%(resource_id)s, %(floor)s, NULL, clock_timestamp())
ON CONFLICT ({r}) DO UPDATE
   SET {h} = GREATEST({t}.{h}, EXCLUDED.{h}),
       {x} = CASE WHEN EXCLUDED.{h} > {t}.{h}
                              THEN NULL ELSE {t}.{x} END,
       updated_at = clock_timestamp()
RETURNING {h}
"""

    @property
    def allow_retry_sql(self) -> str:
        """After a NOT_SENT attempt: the same operation may come back with the same token, and
        only if no newer token has touched the mark meanwhile."""
        t, r, h, x = self.table, self.resource_column, self.token_column, self.retry_column
        return f"""
UPDATE {t} SET {x} = %(operation)s::{self.retry_type}, updated_at = clock_timestamp()
 WHERE {r} = %(resource_id)s AND {h} = %(token)s
"""

    def advance(self, cursor: Any, *, resource_id: str, token: int, operation: str) -> bool:
        """Step 1: True if the mark moved to `token` (or re-admits `operation`); False: fenced."""
        if token <= 0:  # the first admission's insert is the advance from 0 only for tokens > 0
            raise ValueError("fencing tokens are positive")
        cursor.execute(
            self.advance_sql,
            {"resource_id": resource_id, "token": token, "operation": operation},
        )
        return cursor.fetchone() is not None

    def highest(self, cursor: Any, *, resource_id: str) -> int:
        cursor.execute(self.highest_sql, {"resource_id": resource_id})
        row = cursor.fetchone()
        return int(row[0]) if row else 0

    def admits(
        self, cursor: Any, *, resource_id: str, token: int, operation: str
    ) -> tuple[int, bool]:
        """(highest token, would `advance` admit `token`), the mark row-locked; a resource
        without a mark admits every (positive) token."""
        cursor.execute(
            self.admits_sql, {"resource_id": resource_id, "token": token, "operation": operation}
        )
        row = cursor.fetchone()
        return (int(row[0]), bool(row[1])) if row else (0, True)

    def raise_floor(self, cursor: Any, *, resource_id: str, floor: int) -> int:
        cursor.execute(self.raise_floor_sql, {"resource_id": resource_id, "floor": floor})
        return int(cursor.fetchone()[0])

    def allow_retry(self, cursor: Any, *, resource_id: str, token: int, operation: str) -> bool:
        cursor.execute(
            self.allow_retry_sql,
            {"resource_id": resource_id, "token": token, "operation": operation},
        )
        return cursor.rowcount == 1


@dataclass(frozen=True)
class IntentLog:
    """Step 2 and 3's table: one row per attempt; `live_outcomes` are the attempts that reached
    (or may have reached) the third party, so a second one is refused."""

    table: str = "fence_intent"
    id_column: str = "intent_id"
    operation_column: str = "operation_id"
    outcome_column: str = "outcome"
    token_column: str = "token"  # noqa: S105 - a column name
    live_outcomes: tuple[str, ...] = LIVE_OUTCOMES
    # Only the default insert and resolve use these (a table with its own writer ignores them).
    resource_column: str = "resource_id"
    owner_column: str = "owner_id"
    result_column: str = "result"
    resolved_column: str = "resolved_at"

    def __post_init__(self) -> None:
        for name in (
            self.table,
            self.id_column,
            self.operation_column,
            self.outcome_column,
            self.token_column,
            self.resource_column,
            self.owner_column,
            self.result_column,
            self.resolved_column,
        ):
            _name(name)
        for outcome in self.live_outcomes:
            _name(outcome)

    @property
    def live_sql(self) -> str:
        outcomes = ", ".join(f"'{outcome}'" for outcome in self.live_outcomes)
        return f"""
SELECT {self.id_column}, {self.outcome_column}, {self.token_column}
  FROM {self.table}
 WHERE {self.operation_column} = %(operation)s AND {self.outcome_column} IN ({outcomes})
 LIMIT 1
"""

    def live(self, cursor: Any, *, operation: str) -> tuple[Any, str, int] | None:
        """Step 2: the operation's live attempt (id, outcome, token), if any."""
        cursor.execute(self.live_sql, {"operation": operation})
        return cursor.fetchone()

    @property
    def insert_sql(self) -> str:
        """Step 3: the attempt's PENDING row."""
        columns = ", ".join(
            (
                self.id_column,
                self.operation_column,
                self.resource_column,
                self.token_column,
                self.owner_column,
                self.outcome_column,
            )
        )
        return f"""
INSERT INTO {self.table} ({columns})
VALUES (%(intent_id)s, %(operation)s, %(resource_id)s, %(token)s, %(owner_id)s, '{PENDING}')
"""

    @property
    def resolve_sql(self) -> str:
        """The outcome, only on a PENDING row (the first resolver wins)."""
        o = self.outcome_column
        return f"""
UPDATE {self.table} SET {o} = %(outcome)s, {self.result_column} = %(result)s::jsonb,
       {self.resolved_column} = clock_timestamp()
 WHERE {self.id_column} = %(intent_id)s AND {o} = '{PENDING}'
"""
