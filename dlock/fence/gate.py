"""The gate in front of a call that cannot be made twice (a payment rail, an e-mail, a webhook).

A fenced UPDATE protects a row; a third party has no row to fence. The gate keeps the fence on
your side, in PostgreSQL, and lets a call through only in this order:

1. advance the resource's high-water mark to the presented token, strictly (`highest < token`)
   — else FencedOut: a newer holder already reached the third party;
2. no live attempt for this operation (the same payment, the same e-mail) — else
   DuplicateOperation: resolve from the record, never call twice;
3. insert the intent row (PENDING) and COMMIT — before the call, so a crash after it leaves a
   record to reconcile;
then make the call and record its outcome: SUCCEEDED, FAILED (a definite refusal), NOT_SENT
(provably never left: the same operation may come back under the same token) or AMBIGUOUS
(sent, answer lost: quarantined — the operation stays live and refuses further attempts until
someone reconciles it with the third party).

rail-proxy runs its submissions through these statements (railproxy.fenced_sql builds them from
its own `HighWaterMark` and `IntentLog` tables); an adopter uses `SideEffectGate.run` with the
default tables (`GATE_SCHEMA_SQL`). Table and column names are identifiers chosen in code,
never input.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from dlock.errors import ApiError, Code
from dlock.fence.refusals import FencedOut, fenced_out

T = TypeVar("T")

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

    def __post_init__(self) -> None:
        for name in (
            self.table,
            self.id_column,
            self.operation_column,
            self.outcome_column,
            self.token_column,
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


class DuplicateOperation(ApiError):
    """409 DUPLICATE_SUBMISSION: this operation already has an attempt that reached (or may
    have reached) the third party; resolve from that record, never call again."""

    def __init__(self, *, operation_id: str, presented_token: int, existing: tuple) -> None:
        super().__init__(
            Code.DUPLICATE_SUBMISSION,
            "this operation already has an attempt on record; resolve from that record",
            details={
                "operationId": operation_id,
                "presentedToken": presented_token,
                "existingIntentId": str(existing[0]),
                "existingOutcome": existing[1],
                "existingToken": existing[2],
            },
        )
        self.existing = existing


class NotSent(Exception):
    """Raise from the gated call when the request provably never left (connection refused,
    nothing written): recorded NOT_SENT, the same operation may be retried under this token."""


class Declined(Exception):
    """Raise from the gated call when the third party definitely refused: recorded FAILED
    (with `result`), the operation stays on record and is not attempted again."""

    def __init__(self, result: Any = None) -> None:
        self.result = result
        super().__init__("the third party declined the operation")


class Ambiguous(Exception):
    """The call may or may not have taken effect: its intent is quarantined (AMBIGUOUS)."""

    def __init__(self, intent_id: uuid.UUID, cause: BaseException) -> None:
        self.intent_id = intent_id
        super().__init__(f"outcome of intent {intent_id} unknown ({cause!r}); quarantined")


@dataclass(frozen=True)
class Intent:
    intent_id: uuid.UUID
    operation_id: str
    resource_id: str
    token: int


_INSERT_INTENT_SQL = """
INSERT INTO fence_intent (intent_id, operation_id, resource_id, token, owner_id, outcome)
VALUES (%(intent_id)s, %(operation)s, %(resource_id)s, %(token)s, %(owner_id)s, 'PENDING')
"""
_RESOLVE_INTENT_SQL = """
UPDATE fence_intent SET outcome = %(outcome)s, result = %(result)s::jsonb,
       resolved_at = clock_timestamp()
 WHERE intent_id = %(intent_id)s AND outcome = 'PENDING'
"""


class SideEffectGate:
    """Steps 1–3 and the outcome record on the default tables, for one resource type.

    Stateless apart from its configuration: share one per resource type across threads; each
    call brings its own connection (psycopg 3, or a pool's).
    """

    def __init__(self, *, resource_type: str) -> None:
        self.resource_type = resource_type
        self.mark = HighWaterMark()
        self.intents = IntentLog()

    def admit(
        self, cursor: Any, *, resource_id: str, operation_id: str, token: int, owner_id: str
    ) -> Intent:
        """Steps 1–3 inside the caller's transaction (commit it before the call)."""
        if not self.mark.advance(
            cursor, resource_id=resource_id, token=token, operation=operation_id
        ):
            raise self._fenced(cursor, resource_id=resource_id, token=token, owner_id=owner_id)
        existing = self.intents.live(cursor, operation=operation_id)
        if existing is not None:
            raise DuplicateOperation(
                operation_id=operation_id, presented_token=token, existing=existing
            )
        intent = Intent(uuid.uuid4(), operation_id, resource_id, token)
        cursor.execute(
            _INSERT_INTENT_SQL,
            {
                "intent_id": intent.intent_id,
                "operation": operation_id,
                "resource_id": resource_id,
                "token": token,
                "owner_id": owner_id,
            },
        )
        return intent

    def _fenced(self, cursor: Any, *, resource_id: str, token: int, owner_id: str) -> FencedOut:
        return fenced_out(
            resource=self.resource_type,
            resource_id=resource_id,
            presented=token,
            highest=self.mark.highest(cursor, resource_id=resource_id),
            owner_id=owner_id,
            message="a newer fencing token already reached this third party",
        )

    def record(self, cursor: Any, intent: Intent, *, outcome: str, result: Any = None) -> bool:
        """The attempt's outcome (SUCCEEDED, FAILED, NOT_SENT, AMBIGUOUS); False if it was no
        longer PENDING (someone reconciled it first). NOT_SENT re-opens the operation for the
        same token."""
        if outcome not in (SUCCEEDED, FAILED, NOT_SENT, AMBIGUOUS):
            raise ValueError(f"unknown outcome {outcome!r}")
        cursor.execute(
            _RESOLVE_INTENT_SQL,
            {
                "intent_id": intent.intent_id,
                "outcome": outcome,
                "result": None if result is None else json.dumps(result),
            },
        )
        moved = cursor.rowcount == 1
        if moved and outcome == NOT_SENT:
            self.mark.allow_retry(
                cursor,
                resource_id=intent.resource_id,
                token=intent.token,
                operation=intent.operation_id,
            )
        return moved

    def run(
        self,
        connection: Any,
        *,
        resource_id: str,
        operation_id: str,
        token: int,
        owner_id: str,
        call: Callable[[], T],
    ) -> T:
        """Admit (committed before the call), call, record. `call` raises NotSent when nothing
        left, Declined for a definite refusal; any other exception quarantines the intent
        (AMBIGUOUS) and raises Ambiguous.
        Raises FencedOut or DuplicateOperation without calling."""
        with connection.transaction(), connection.cursor() as cursor:
            intent = self.admit(
                cursor,
                resource_id=resource_id,
                operation_id=operation_id,
                token=token,
                owner_id=owner_id,
            )
        try:
            result = call()
        except NotSent:
            self._record(connection, intent, NOT_SENT)
            raise
        except Declined as declined:
            self._record(connection, intent, FAILED, declined.result)
            raise
        except Exception as exc:
            self._record(connection, intent, AMBIGUOUS)
            raise Ambiguous(intent.intent_id, exc) from exc
        self._record(connection, intent, SUCCEEDED, result)
        return result

    def _record(self, connection: Any, intent: Intent, outcome: str, result: Any = None) -> None:
        with connection.transaction(), connection.cursor() as cursor:
            self.record(cursor, intent, outcome=outcome, result=result)
