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

from dlock.idempotency import stored_body
from payments.selectors import PAYOUT_FOR_SUBMISSION_SQL, payout_for_submission

if TYPE_CHECKING:
    import datetime as dt
    import uuid

# ---------------------------------------------------------------------------------------------
# SQL

# Admission step 1 (C3 §3.5), one statement: the account's first admission creates its mark at
# this token (every token is > 0, so that is the advance from 0); otherwise strict `>`, and the
# equality arm only re-admits the payout whose attempt under this very token ended NOT_SENT
# (nothing was presented, C3 §3.2 RAIL_UNAVAILABLE). No row back: we are fenced.
ADVANCE_HIGH_WATER_SQL = """
INSERT INTO rail_high_water AS hw (account_id, highest_token, retry_payout_id, updated_at)
VALUES (%(account_id)s, %(token)s, NULL, clock_timestamp())
    ON CONFLICT (account_id) DO UPDATE
   SET highest_token = EXCLUDED.highest_token, retry_payout_id = NULL,
       updated_at = clock_timestamp()
 WHERE hw.highest_token < EXCLUDED.highest_token
    OR (hw.highest_token = EXCLUDED.highest_token AND hw.retry_payout_id = %(payout_id)s::uuid)
RETURNING highest_token
"""

HIGH_WATER_SQL = "SELECT highest_token FROM rail_high_water WHERE account_id = %(account_id)s"

# Would ADVANCE_HIGH_WATER_SQL admit this token? Asked, row-locked, instead of advancing when the
# payout is already known to be claimed under a newer token (the refusal must not move the mark).
HIGH_WATER_ADMITS_SQL = """
SELECT highest_token,
       highest_token < %(token)s
       OR (highest_token = %(token)s AND retry_payout_id = %(payout_id)s::uuid)
  FROM rail_high_water WHERE account_id = %(account_id)s
   FOR UPDATE
"""

RAISE_HIGH_WATER_SQL = """
INSERT INTO rail_high_water (account_id, highest_token, retry_payout_id, updated_at)
VALUES (%(account_id)s, %(floor)s, NULL, clock_timestamp())
ON CONFLICT (account_id) DO UPDATE
   SET highest_token = GREATEST(rail_high_water.highest_token, EXCLUDED.highest_token),
       retry_payout_id = CASE WHEN EXCLUDED.highest_token > rail_high_water.highest_token
                              THEN NULL ELSE rail_high_water.retry_payout_id END,
       updated_at = clock_timestamp()
RETURNING highest_token
"""

# After a NOT_SENT attempt: the same payout may come back with the same token, and only if no
# newer token has touched the mark meanwhile.
REOPEN_FOR_RETRY_SQL = """
UPDATE rail_high_water SET retry_payout_id = %(payout_id)s::uuid, updated_at = clock_timestamp()
 WHERE account_id = %(account_id)s AND highest_token = %(token)s
"""

# Admission step 2 (FR-18): FENCED and NOT_SENT rows never presented anything.
LIVE_SUBMISSION_SQL = """
SELECT submission_id, outcome, presented_token
  FROM rail_submission
 WHERE payout_id = %(payout_id)s AND outcome IN ('PENDING', 'ACKED', 'TIMEOUT', 'DECLINED')
 LIMIT 1
"""

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
    if token <= 0:  # the first admission's insert is the advance from 0 only for tokens > 0
        raise ValueError("fencing tokens are positive")
    cursor.execute(
        ADVANCE_HIGH_WATER_SQL,
        {"account_id": account_id, "token": token, "payout_id": str(payout_id)},
    )
    row = cursor.fetchone()
    return row[0] if row else None


def high_water(cursor: Any, *, account_id: str) -> int:
    cursor.execute(HIGH_WATER_SQL, {"account_id": account_id})
    row = cursor.fetchone()
    return row[0] if row else 0


def raise_high_water(cursor: Any, *, account_id: str, floor: int) -> int:
    """highest_token = GREATEST(highest_token, floor), inserting the row if absent (revoke push).

    A raised mark clears the same-token retry allowance: the floor came from a newer grant.
    """
    cursor.execute(RAISE_HIGH_WATER_SQL, {"account_id": account_id, "floor": floor})
    return cursor.fetchone()[0]


def allow_same_token_retry(
    cursor: Any, *, account_id: str, token: int, payout_id: uuid.UUID
) -> bool:
    cursor.execute(
        REOPEN_FOR_RETRY_SQL,
        {"account_id": account_id, "token": token, "payout_id": str(payout_id)},
    )
    return cursor.rowcount == 1


def live_submission(cursor: Any, *, payout_id: uuid.UUID) -> tuple[Any, str, int] | None:
    """Admission step 2: the payout's existing submission (id, outcome, token), if any."""
    cursor.execute(LIVE_SUBMISSION_SQL, {"payout_id": str(payout_id)})
    return cursor.fetchone()


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


def high_water_admits(
    cursor: Any, *, account_id: str, token: int, payout_id: uuid.UUID
) -> tuple[int, bool]:
    """(highest token, would ADVANCE_HIGH_WATER_SQL admit `token`), the mark row-locked; an
    account without a mark admits every (positive) token."""
    cursor.execute(
        HIGH_WATER_ADMITS_SQL,
        {"account_id": account_id, "token": token, "payout_id": str(payout_id)},
    )
    row = cursor.fetchone()
    return (int(row[0]), bool(row[1])) if row else (0, True)


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
