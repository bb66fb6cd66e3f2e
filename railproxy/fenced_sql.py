"""The rail proxy's fenced layer: the high-water mark and the submission records in paydb.

Raw SQL because every decision here is "did this one conditional UPDATE move a row?" (or which
row a lock-protected SELECT saw); the ORM cannot express `SET highest_token = :t WHERE
highest_token < :t RETURNING …` as one statement. The caller raises the typed error.
Every function takes a Django cursor on `connections[alias_for("railproxy")]` and runs inside
the caller's `transaction.atomic(using=alias_for("railproxy"))`.

Exported for other apps (docs/briefs/INTERFACES.md): `raise_high_water`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dlock.fence.gate import SideEffectGate
from dlock.fence.marks import AMBIGUOUS, FAILED, NOT_SENT, SUCCEEDED, HighWaterMark, IntentLog
from dlock.idempotency import stored_body
from payments.selectors import PAYOUT_FOR_SUBMISSION_SQL, payout_for_submission

if TYPE_CHECKING:
    import datetime as dt
    import uuid

# ---------------------------------------------------------------------------------------------
# SQL

# The rail's side-effect gate is the fence kit's (dlock.fence.gate) on the proxy's own tables:
# the high-water mark per account, with the one payout that may come back under the same token
# after a NOT_SENT attempt, and the submissions as the intent log (FENCED and NOT_SENT rows
# never presented anything, so they are not live). Admission (steps 1–3) and the outcome's
# record run through RAIL_GATE; railproxy.admission and railproxy.recording bring the payout.
RAIL_MARK = HighWaterMark(
    table="rail_high_water",
    resource_column="account_id",
    token_column="highest_token",  # noqa: S106 - a column name
    retry_column="retry_payout_id",
    retry_type="uuid",
)
RAIL_INTENTS = IntentLog(
    table="rail_submission",
    id_column="submission_id",
    operation_column="payout_id",
    outcome_column="outcome",
    token_column="presented_token",  # noqa: S106 - a column name
    live_outcomes=("PENDING", "ACKED", "TIMEOUT", "DECLINED"),
)
# The gate's outcome of each rail outcome (railproxy.models.Outcome).
GATE_OUTCOME = {"ACKED": SUCCEEDED, "TIMEOUT": AMBIGUOUS, "DECLINED": FAILED, "NOT_SENT": NOT_SENT}
FENCED_HIGH_WATER_MESSAGE = "a newer fencing token already reached the rail for this account"
RAIL_GATE = SideEffectGate(
    resource_type="rail",
    mark=RAIL_MARK,
    intents=RAIL_INTENTS,
    fenced_message=FENCED_HIGH_WATER_MESSAGE,
)

# Admission step 0, after the identity's lock (an earlier statement, so this snapshot sees a
# twin's committed row): the identity's recorded row, else the payout, row-locked for the whole
# admission (its state and claim token cannot move until the intent commits).
REPLAY_OR_PAYOUT_SQL = f"""
WITH rec AS (
    SELECT submission_id, outcome, request_hash, response_status, response_body
      FROM rail_submission
     WHERE idempotency_key = %(key)s AND presented_token = %(token)s AND outcome <> 'NOT_SENT'
     ORDER BY submitted_at DESC
     LIMIT 1
), p AS (
    {PAYOUT_FOR_SUBMISSION_SQL.strip()}
       AND NOT EXISTS (SELECT 1 FROM rec)
       FOR UPDATE
)
SELECT rec.*, p.* FROM (SELECT 1) AS one LEFT JOIN rec ON true LEFT JOIN p ON true
"""

INSERT_SUBMISSION_SQL = """
INSERT INTO rail_submission (
    submission_id, payout_id, account_id, amount_minor, currency, presented_token,
    highest_token, owner_id, idempotency_key, request_hash, client_ref, outcome, detail,
    submitted_at, resolved_at, response_status, response_body)
VALUES (
    %(submission_id)s, %(payout_id)s, %(account_id)s, %(amount_minor)s, %(currency)s,
    %(token)s, %(highest_token)s, %(owner_id)s, %(key)s, %(request_hash)s, %(client_ref)s,
    %(outcome)s, %(detail)s, clock_timestamp(),
    CASE WHEN %(outcome)s::varchar = 'PENDING' THEN NULL ELSE clock_timestamp() END,
    %(response_status)s, %(response_body)s)
RETURNING submitted_at
"""

# Only an unresolved intent takes an outcome: the forwarder and the sweep race here, and the
# first conditional UPDATE wins. With `stamped`, the stored answer ends with the row's
# submittedAt and resolvedAt as the wire writes them (dlock.timefmt.rfc3339_ms: UTC,
# milliseconds truncated, "Z"), so the 200 and its record are written in this one statement.
RESOLVE_SUBMISSION_SQL = """
WITH now AS (SELECT clock_timestamp() AS at)
UPDATE rail_submission
   SET outcome = %(outcome)s, detail = %(detail)s, rail_reference = %(rail_reference)s,
       resolved_at = now.at, response_status = %(response_status)s,
       response_body = CASE WHEN %(stamped)s::boolean
           THEN %(response_body)s::text
                || '"submittedAt":"'
                || to_char(submitted_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')
                || '","resolvedAt":"'
                || to_char(now.at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')
                || '"}'
           ELSE %(response_body)s::text END
  FROM now
 WHERE submission_id = %(submission_id)s AND outcome = 'PENDING'
RETURNING submitted_at, resolved_at
"""

SUBMISSION_SQL = """
SELECT outcome, rail_reference, response_status, response_body
  FROM rail_submission WHERE submission_id = %(submission_id)s
"""

STALE_INTENTS_SQL = """
SELECT submission_id, payout_id, account_id, presented_token, owner_id
  FROM rail_submission
 WHERE outcome = 'PENDING'
   AND submitted_at < clock_timestamp() - make_interval(secs => %(age_s)s)
 ORDER BY submitted_at
 LIMIT %(limit)s
   FOR UPDATE SKIP LOCKED
"""

# ---------------------------------------------------------------------------------------------
# Functions


@dataclass(frozen=True)
class PayoutRow:
    account_id: str
    amount_minor: int
    currency: str
    beneficiary_ref: str
    state: str
    claim_token: int | None
    claim_owner_id: str | None
    idempotency_key: str


def _text(body: dict | None) -> str | None:
    """An answer as its wire bytes: the separators of dlock.rendering.json_response and of the
    error envelope (ApiError.envelope_bytes), so the stored text is what was sent."""
    return json.dumps(body, separators=(",", ":")) if body is not None else None


def advance_high_water(
    cursor: Any, *, account_id: str, token: int, payout_id: uuid.UUID
) -> int | None:
    """Admission step 1: None if a token ≥ ours already reached the rail (we are fenced)."""
    moved = RAIL_MARK.advance(cursor, resource_id=account_id, token=token, operation=str(payout_id))
    return token if moved else None


def high_water(cursor: Any, *, account_id: str) -> int:
    return RAIL_MARK.highest(cursor, resource_id=account_id)


def raise_high_water(cursor: Any, *, account_id: str, floor: int) -> int:
    """highest_token = GREATEST(highest_token, floor), inserting the row if absent (revoke push).

    A raised mark clears the same-token retry allowance: the floor came from a newer grant.
    """
    return RAIL_MARK.raise_floor(cursor, resource_id=account_id, floor=floor)


def allow_same_token_retry(
    cursor: Any, *, account_id: str, token: int, payout_id: uuid.UUID
) -> bool:
    return RAIL_MARK.allow_retry(
        cursor, resource_id=account_id, token=token, operation=str(payout_id)
    )


def live_submission(cursor: Any, *, payout_id: uuid.UUID) -> tuple[Any, str, int] | None:
    """Admission step 2: the payout's existing submission (id, outcome, token), if any."""
    return RAIL_INTENTS.live(cursor, operation=str(payout_id))


def payout(cursor: Any, *, payout_id: uuid.UUID, for_update: bool = False) -> PayoutRow | None:
    """The payout as the payments app stores it, read through its selector; `for_update` in
    admission step 3."""
    row = payout_for_submission(cursor, payout_id=payout_id, for_update=for_update)
    return PayoutRow(*row) if row else None


@dataclass(frozen=True)
class ReplayOrPayout:
    """The identity's recorded row (submission_id, outcome, request_hash, response_status,
    response_body), else the payout (row-locked; None for an unknown payout)."""

    recorded: tuple | None
    payout: PayoutRow | None


def replay_or_payout(cursor: Any, *, key: str, token: int, payout_id: uuid.UUID) -> ReplayOrPayout:
    """Admission step 0 in one round trip. Callers hold the identity's lock
    (dlock.idempotency.lock_identity), taken in an earlier statement."""
    cursor.execute(REPLAY_OR_PAYOUT_SQL, {"key": key, "token": token, "payout_id": str(payout_id)})
    row = cursor.fetchone()
    if row[0] is not None:
        return ReplayOrPayout((*row[:4], stored_body(row[4])), None)
    if row[5] is None:
        return ReplayOrPayout(None, None)
    return ReplayOrPayout(None, PayoutRow(*row[5:]))


def insert_submission(
    cursor: Any,
    *,
    submission_id: uuid.UUID,
    payout_id: uuid.UUID,
    account_id: str,
    amount_minor: int,
    currency: str,
    token: int,
    owner_id: str,
    key: str,
    request_hash: str,
    client_ref: str,
    outcome: str,
    highest_token: int | None = None,
    detail: str | None = None,
    response_status: int | None = None,
    response_body: dict | None = None,
) -> dt.datetime:
    """Insert one submission row; returns its submitted_at (the database clock)."""
    cursor.execute(
        INSERT_SUBMISSION_SQL,
        {
            "submission_id": str(submission_id),
            "payout_id": str(payout_id),
            "account_id": account_id,
            "amount_minor": amount_minor,
            "currency": currency,
            "token": token,
            "highest_token": highest_token,
            "owner_id": owner_id,
            "key": key,
            "request_hash": request_hash,
            "client_ref": client_ref,
            "outcome": outcome,
            "detail": detail,
            "response_status": response_status,
            "response_body": _text(response_body),
        },
    )
    return cursor.fetchone()[0]


STAMPS = ("submittedAt", "resolvedAt")


def resolve_submission(
    cursor: Any,
    *,
    submission_id: uuid.UUID,
    outcome: str,
    detail: str | None,
    rail_reference: str | None,
    response_status: int,
    response_body: dict,
    stamped: bool = False,
) -> tuple[dt.datetime, dt.datetime] | None:
    """PENDING → outcome; (submitted_at, resolved_at), or None if already resolved (swept).

    `stamped`: `response_body` ends with the keys `STAMPS` (values ignored); the stored text
    gets the row's own times there, as `rfc3339_ms` of the returned pair writes them."""
    text: str | None
    if stamped:
        if tuple(response_body)[-2:] != STAMPS:
            raise ValueError(f"a stamped answer ends with {STAMPS}")
        head = {k: v for k, v in response_body.items() if k not in STAMPS}
        text = json.dumps(head, separators=(",", ":"))[:-1] + ("," if head else "")
    else:
        text = _text(response_body)
    cursor.execute(
        RESOLVE_SUBMISSION_SQL,
        {
            "submission_id": str(submission_id),
            "outcome": outcome,
            "detail": detail,
            "rail_reference": rail_reference,
            "response_status": response_status,
            "response_body": text,
            "stamped": stamped,
        },
    )
    return cursor.fetchone()


def submission(cursor: Any, *, submission_id: uuid.UUID) -> tuple | None:
    """(outcome, rail_reference, response_status, response_body) of one row."""
    cursor.execute(SUBMISSION_SQL, {"submission_id": str(submission_id)})
    row = cursor.fetchone()
    return (*row[:3], stored_body(row[3])) if row else None


def stale_intents(cursor: Any, *, older_than_s: float, limit: int = 100) -> list[tuple]:
    """PENDING intents older than `older_than_s` (database clock), locked, skipping busy rows."""
    cursor.execute(STALE_INTENTS_SQL, {"age_s": older_than_s, "limit": limit})
    return cursor.fetchall()
