"""The gate in front of a call that cannot be made twice (a payment rail, an e-mail, a webhook).

A fenced UPDATE protects a row; a third party has no row to fence. The gate keeps the fence on
your side, in PostgreSQL, and lets a call through only in this order:

1. advance the resource's high-water mark to the presented token, strictly (`highest < token`)
   — else FencedOut: a newer holder already reached the third party;
2. no live attempt for this operation (the same payment, the same e-mail) — else
   DuplicateOperation: resolve from the record, never call twice;
3. the resource's own precondition, if any (rail-proxy: the payout is CLAIMED under this very
   token), then the intent row (PENDING) and COMMIT — before the call, so a crash after it
   leaves a record to reconcile;
then make the call and record its outcome: SUCCEEDED, FAILED (a definite refusal), NOT_SENT
(provably never left: the same operation may come back under the same token) or AMBIGUOUS
(sent, answer lost: quarantined — the operation stays live and refuses further attempts until
someone reconciles it with the third party).

`SideEffectGate.run` is the whole protocol on one psycopg connection; `admit` and `record` are
its two transactions for a caller that runs its own (rail-proxy, on its own tables and rows).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from dlock.errors import ApiError, Code
from dlock.fence.marks import (
    AMBIGUOUS,
    FAILED,
    NOT_SENT,
    SUCCEEDED,
    HighWaterMark,
    IntentLog,
)
from dlock.fence.refusals import FencedOut, fenced_out

T = TypeVar("T")

FENCED_MESSAGE = "a newer fencing token already reached this third party"
# The reason a step-1 refusal carries (the `fenced_out` log line, `on_fenced`).
FENCED_HIGH_WATER = "fenced_high_water"


class DuplicateOperation(ApiError):
    """409 DUPLICATE_SUBMISSION: this operation already has an attempt that reached (or may
    have reached) the third party; resolve from that record, never call again. `existing` is
    the live attempt (id, outcome, token)."""

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
    """One admitted attempt; `written` is what the intent's writer returned (e.g. its row's
    time)."""

    intent_id: uuid.UUID
    operation_id: str
    resource_id: str
    token: int
    written: Any = None


@dataclass(frozen=True)
class Superseded:
    """The operation's own record already belongs to a newer token (rail-proxy: the payout was
    re-claimed under one), known before step 1. Step 1 then only asks the mark (a refusal must
    not move it) and the admission is fenced after step 2 with `highest_token` on
    `resource_id`, unless step 1 or 2 refused first."""

    resource_id: str
    highest_token: int
    reason: str
    message: str = FENCED_MESSAGE


# on_fenced(cursor, refusal, reason): keep the refusal on record before it is raised.
OnFenced = Callable[[Any, FencedOut, str], None]


@dataclass(frozen=True)
class _Presenter:
    token: int
    owner_id: str
    on_fenced: OnFenced | None
    log_fields: Mapping[str, Any]


class SideEffectGate:
    """Steps 1–3 and the outcome record, for one resource type, on its two tables (the
    defaults of GATE_SCHEMA_SQL, or `mark` and `intents` configured on your own).

    Stateless apart from its configuration: share one per resource type across threads; each
    call brings its own cursor or connection (psycopg 3, a pool's, or Django's).
    """

    def __init__(
        self,
        *,
        resource_type: str,
        mark: HighWaterMark | None = None,
        intents: IntentLog | None = None,
        fenced_message: str = FENCED_MESSAGE,
    ) -> None:
        self.resource_type = resource_type
        self.mark = mark or HighWaterMark()
        self.intents = intents or IntentLog()
        self.fenced_message = fenced_message

    def admit(
        self,
        cursor: Any,
        *,
        resource_id: str,
        operation_id: str,
        token: int,
        owner_id: str,
        superseded: Superseded | None = None,
        precondition: Callable[[Any, Intent], None] | None = None,
        write_intent: Callable[[Any, Intent], Any] | None = None,
        on_fenced: OnFenced | None = None,
        log_fields: Mapping[str, Any] | None = None,
    ) -> Intent:
        """Steps 1–3 inside the caller's transaction (commit it before the call).

        `precondition(cursor, intent)` is the resource's own step 3 (raise its refusal, or move
        its own row); `write_intent(cursor, intent)` writes the PENDING row instead of the
        default insert, its return value lands in `intent.written`; `on_fenced` keeps a refusal
        on record before the FencedOut is raised (a row outside the live outcomes blocks no
        later attempt; commit if you catch it). `log_fields` go on the `fenced_out` line.
        Raises FencedOut or DuplicateOperation.
        """
        step: dict[str, Any] = {
            "resource_id": resource_id,
            "token": token,
            "operation": operation_id,
        }
        if superseded is not None:
            highest, admits = self.mark.admits(cursor, **step)
        else:
            admits = self.mark.advance(cursor, **step)
            highest = 0 if admits else self.mark.highest(cursor, resource_id=resource_id)
        presenter = _Presenter(token, owner_id, on_fenced, log_fields or {})
        if not admits:
            raise self._fenced(
                cursor, presenter, resource_id, highest, FENCED_HIGH_WATER, self.fenced_message
            )
        existing = self.intents.live(cursor, operation=operation_id)
        if existing is not None:
            raise DuplicateOperation(
                operation_id=operation_id, presented_token=token, existing=existing
            )
        if superseded is not None:
            raise self._fenced(
                cursor,
                presenter,
                superseded.resource_id,
                superseded.highest_token,
                superseded.reason,
                superseded.message,
            )
        intent = Intent(uuid.uuid4(), operation_id, resource_id, token)
        if precondition is not None:
            precondition(cursor, intent)
        if write_intent is not None:
            return replace(intent, written=write_intent(cursor, intent))
        cursor.execute(
            self.intents.insert_sql,
            {
                "intent_id": intent.intent_id,
                "operation": operation_id,
                "resource_id": resource_id,
                "token": token,
                "owner_id": owner_id,
            },
        )
        return intent

    def _fenced(
        self,
        cursor: Any,
        presenter: _Presenter,
        resource_id: str,
        highest: int,
        reason: str,
        message: str,
    ) -> FencedOut:
        refusal = fenced_out(
            resource=self.resource_type,
            resource_id=resource_id,
            presented=presenter.token,
            highest=highest,
            owner_id=presenter.owner_id,
            message=message,
            **presenter.log_fields,
            reason=reason,
        )
        if presenter.on_fenced is not None:
            presenter.on_fenced(cursor, refusal, reason)
        return refusal

    def record(
        self,
        cursor: Any,
        intent: Intent,
        *,
        outcome: str,
        result: Any = None,
        resolve: Callable[[Any], Any] | None = None,
    ) -> Any:
        """The attempt's outcome (SUCCEEDED, FAILED, NOT_SENT, AMBIGUOUS), only on a PENDING
        intent; falsy if it was no longer PENDING (someone reconciled it first). NOT_SENT
        re-opens the operation for the same token. `resolve(cursor)` is a table's own
        conditional resolve (returns its row, None when nothing moved) instead of the default."""
        if outcome not in (SUCCEEDED, FAILED, NOT_SENT, AMBIGUOUS):
            raise ValueError(f"unknown outcome {outcome!r}")
        if resolve is not None:
            resolved = resolve(cursor)
        else:
            cursor.execute(
                self.intents.resolve_sql,
                {
                    "intent_id": intent.intent_id,
                    "outcome": outcome,
                    "result": None if result is None else json.dumps(result),
                },
            )
            resolved = cursor.rowcount == 1
        if resolved and outcome == NOT_SENT:
            self.mark.allow_retry(
                cursor,
                resource_id=intent.resource_id,
                token=intent.token,
                operation=intent.operation_id,
            )
        return resolved

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
