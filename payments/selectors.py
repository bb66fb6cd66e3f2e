"""Payment-resource reads (P1, P4, P5). Advisory: no decision may be taken from them."""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
import uuid
from typing import Any

from django.db import connections

from dlock.dbrouter import alias_for
from dlock.errors import ApiError, not_found, validation_error
from dlock.timefmt import rfc3339_ms
from payments.models import PayoutState

LIMIT_MIN, LIMIT_MAX, LIMIT_DEFAULT = 1, 500, 100
_CURSOR_VERSION = 1


def _alias() -> str:
    return alias_for("payments")


# ---------------------------------------------------------------------------------------------
# P1: keyset pagination on (created_at, payout_id): a row inserted while a client pages sorts
# after every row already returned (its created_at is later), so pages never skip or repeat.


def encode_cursor(created_at: dt.datetime, payout_id: uuid.UUID, state: str, account: str) -> str:
    raw = json.dumps(
        [_CURSOR_VERSION, created_at.isoformat(), str(payout_id), state, account],
        separators=(",", ":"),
    )
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _bad_cursor(reason: str) -> ApiError:
    return validation_error(
        f"cursor is not one this service issued ({reason})",
        [{"field": "cursor", "message": "opaque nextCursor from a previous page"}],
    )


def decode_cursor(raw: str, *, state: str, account: str) -> tuple[dt.datetime, uuid.UUID]:
    if len(raw) > 512:
        raise _bad_cursor("too long")
    try:
        padded = raw + "=" * (-len(raw) % 4)
        decoded = json.loads(base64.urlsafe_b64decode(padded.encode("ascii")).decode())
    except (ValueError, UnicodeError, binascii.Error):
        raise _bad_cursor("undecodable") from None
    if not (isinstance(decoded, list) and len(decoded) == 5 and decoded[0] == _CURSOR_VERSION):
        raise _bad_cursor("wrong shape")
    _, created_raw, payout_raw, cursor_state, cursor_account = decoded
    if not all(isinstance(v, str) for v in (created_raw, payout_raw, cursor_state, cursor_account)):
        raise _bad_cursor("wrong shape")
    try:
        created_at = dt.datetime.fromisoformat(created_raw)
        payout_id = uuid.UUID(payout_raw)
    except ValueError:
        raise _bad_cursor("bad position") from None
    # Issued cursors are UTC; any other offset (e.g. a forged +23:59, which PostgreSQL cannot
    # store) is not ours and must not reach the database as a DataError.
    if created_at.utcoffset() != dt.timedelta(0):
        raise _bad_cursor("bad position")
    if (cursor_state, cursor_account) != (state, account):
        raise _bad_cursor("issued for different filters")
    return created_at, payout_id


LIST_COLUMNS = (
    "payout_id",
    "account_id",
    "amount_minor",
    "currency",
    "state",
    "attempt_count",
    "created_at",
)
# Plain SQL: ORM query compilation was ~6 % of payment-resource CPU under the e2e load. The
# row comparison is the keyset condition created_at > t OR (created_at = t AND payout_id > id).
LIST_SQL = (
    f"SELECT {', '.join(LIST_COLUMNS)} FROM payout {{where}}"
    " ORDER BY created_at, payout_id LIMIT %(limit)s"
)


def list_payouts(
    *, state: str | None, account_id: str | None, limit: int, cursor: str | None
) -> dict[str, Any]:
    """P1 page: items ordered by (createdAt, payoutId), and nextCursor when more may follow."""
    where: list[str] = []
    params: dict[str, Any] = {"limit": limit + 1}
    if state:
        where.append("state = %(state)s")
        params["state"] = state
    if account_id:
        where.append("account_id = %(account_id)s")
        params["account_id"] = account_id
    if cursor:
        after_at, after_id = decode_cursor(cursor, state=state or "", account=account_id or "")
        where.append("(created_at, payout_id) > (%(after_at)s, %(after_id)s)")
        params.update(after_at=after_at, after_id=str(after_id))
    sql = LIST_SQL.format(where=f"WHERE {' AND '.join(where)}" if where else "")
    with connections[_alias()].cursor() as cur:
        cur.execute(sql, params)
        rows = [dict(zip(LIST_COLUMNS, row, strict=True)) for row in cur.fetchall()]
    page, more = rows[:limit], len(rows) > limit
    body: dict[str, Any] = {
        "items": [
            {
                "payoutId": str(r["payout_id"]),
                "accountId": r["account_id"],
                "amountMinor": r["amount_minor"],
                "currency": r["currency"],
                "state": r["state"],
                "attemptCount": r["attempt_count"],
                "createdAt": rfc3339_ms(r["created_at"]),
            }
            for r in page
        ]
    }
    if more:
        last = page[-1]
        body["nextCursor"] = encode_cursor(
            last["created_at"], last["payout_id"], state or "", account_id or ""
        )
    return body


STATES = tuple(s.value for s in PayoutState)


# ---------------------------------------------------------------------------------------------
# P4

# The payout and its attempts in one round trip (the executor reads P4 before every claim, so
# this is on the hot path): one row per submission, or one row with NULL submission columns.
PAYOUT_SQL = """
SELECT p.payout_id, p.account_id, p.amount_minor, p.currency, p.beneficiary_ref, p.state,
       p.attempt_count, p.claim_token, p.claim_owner_id, p.idempotency_key, p.rail_reference,
       p.created_at, p.updated_at,
       s.submission_id, s.presented_token, s.owner_id, s.outcome, s.rail_reference,
       s.submitted_at, s.resolved_at, s.detail
  FROM payout p
  LEFT JOIN rail_submission s ON s.payout_id = p.payout_id
 WHERE p.payout_id = %(payout_id)s
 ORDER BY s.submitted_at, s.submission_id
"""


def get_payout(*, payout_id: uuid.UUID) -> dict[str, Any]:
    with connections[_alias()].cursor() as cur:
        cur.execute(PAYOUT_SQL, {"payout_id": str(payout_id)})
        rows = cur.fetchall()
    if not rows:
        raise not_found("payout", str(payout_id))
    p = rows[0]
    return {
        "payoutId": str(p[0]),
        "accountId": p[1],
        "amountMinor": p[2],
        "currency": p[3],
        "beneficiaryRef": p[4],
        "state": p[5],
        "attemptCount": p[6],
        "claimToken": p[7],
        "claimOwnerId": p[8],
        "idempotencyKey": p[9],
        "railReference": p[10],
        "createdAt": rfc3339_ms(p[11]),
        "updatedAt": rfc3339_ms(p[12]),
        "submissions": [
            {
                "submissionId": str(r[13]),
                "presentedToken": r[14],
                "ownerId": r[15],
                "outcome": r[16],
                "railReference": r[17],
                "submittedAt": rfc3339_ms(r[18]),
                "resolvedAt": rfc3339_ms(r[19]),
                "detail": r[20],
            }
            for r in rows
            if r[13] is not None
        ],
    }


# ---------------------------------------------------------------------------------------------
# The balance of an account, and P5


def balance_sql(account: str = "a") -> str:
    """The balance of the `account` row (a table alias or name) as an SQL expression: its own
    balance_minor plus its settlement buckets (CHANGELOG row 75: P3 spreads the credits to
    `settlement:<ccy>` over bucket rows; other accounts have none, so the sum is 0). The one
    definition every reader of a balance uses — P5, the admin, the reconciler, the experiment —
    so none reads a settlement account's row alone. An index probe on the buckets' primary key."""
    return (
        f"({account}.balance_minor + COALESCE((SELECT SUM(sb.balance_minor)::bigint"
        f" FROM settlement_bucket sb WHERE sb.account_id = {account}.account_id), 0))"
    )


ACCOUNT_SQL = f"""
SELECT a.account_id, a.currency, {balance_sql("a")}, a.fence, a.updated_at,
       COALESCE((SELECT SUM(CASE e.direction WHEN 'CREDIT' THEN e.amount_minor
                                              ELSE -e.amount_minor END)
                   FROM ledger_entry e WHERE e.account_id = a.account_id), 0)
  FROM account a
 WHERE a.account_id = %(account_id)s
"""


def get_account(*, account_id: str) -> dict[str, Any]:
    """P5. One statement, so balance and the recomputed ledger sum come from one snapshot;
    a divergence is data for the reconciler, still a 200."""
    with connections[_alias()].cursor() as cur:
        cur.execute(ACCOUNT_SQL, {"account_id": account_id})
        row = cur.fetchone()
    if row is None:
        raise not_found("account", account_id)
    return {
        "accountId": row[0],
        "currency": row[1],
        "balanceMinor": int(row[2]),
        "fence": int(row[3]),
        "updatedAt": rfc3339_ms(row[4]),
        "ledgerSumMinor": int(row[5]),
    }


# ---------------------------------------------------------------------------------------------
# Payout reads other apps need (reconciler, rail-proxy admission, experiment, bench). The
# `payout` table is this app's: nobody else spells its SQL. Each takes a DB-API cursor — a
# Django cursor or a plain psycopg one — so a caller keeps its own transaction and snapshot
# (the reconciler's REPEATABLE READ, the proxy's admission transaction, a tool's own URL).
# Raw SQL because callers run them on cursors of their own, not through this app's ORM alias.

PAYOUT_STATE_COUNTS_SQL = """
SELECT state, count(*) FROM payout WHERE payout_id = ANY(%(payout_ids)s::uuid[]) GROUP BY state
"""
PAYOUTS_IN_STATES_SQL = """
SELECT payout_id::text, state FROM payout WHERE state = ANY(%(states)s)
"""
PAYOUT_SUMMARIES_SQL = """
SELECT payout_id::text, account_id, state, amount_minor FROM payout
 WHERE payout_id = ANY(%(payout_ids)s::uuid[])
"""
PAYOUT_FOR_SUBMISSION_SQL = """
SELECT account_id, amount_minor, currency, beneficiary_ref, state, claim_token,
       claim_owner_id, idempotency_key
  FROM payout WHERE payout_id = %(payout_id)s
"""


def payout_state_counts(cursor: Any, *, payout_ids: list[str]) -> dict[str, int]:
    """How many of these payouts are in each state (states with none are absent)."""
    cursor.execute(PAYOUT_STATE_COUNTS_SQL, {"payout_ids": [str(p) for p in payout_ids]})
    return {state: int(count) for state, count in cursor.fetchall()}


def payouts_in_states(cursor: Any, *, states: tuple[str, ...] | list[str]) -> list[tuple[str, str]]:
    """(payoutId, state) of every payout in one of `states`."""
    cursor.execute(PAYOUTS_IN_STATES_SQL, {"states": list(states)})
    return [(payout_id, state) for payout_id, state in cursor.fetchall()]


def payout_summaries(cursor: Any, *, payout_ids: list[str]) -> list[tuple[str, str, str, int]]:
    """(payoutId, accountId, state, amountMinor) of these payouts."""
    cursor.execute(PAYOUT_SUMMARIES_SQL, {"payout_ids": [str(p) for p in payout_ids]})
    return [(pid, account, state, int(amount)) for pid, account, state, amount in cursor.fetchall()]


def payout_for_submission(cursor: Any, *, payout_id: Any, for_update: bool = False) -> tuple | None:
    """(accountId, amountMinor, currency, beneficiaryRef, state, claimToken, claimOwnerId,
    idempotencyKey), or None. `for_update` row-locks it (rail-proxy admission step 3: the
    payout cannot move while the intent row is written)."""
    query = PAYOUT_FOR_SUBMISSION_SQL + (" FOR UPDATE" if for_update else "")
    cursor.execute(query, {"payout_id": str(payout_id)})
    return cursor.fetchone()


# (accountId, balance, Σ CREDIT − Σ DEBIT of its ledger) of every account, or of some: the
# books invariant balance = ledger sum, as the reconciler and the experiment check it.
ACCOUNT_BOOKS_SQL = f"""
SELECT a.account_id, {balance_sql("a")},
       COALESCE(SUM(CASE e.direction WHEN 'CREDIT' THEN e.amount_minor ELSE -e.amount_minor END),
                0)
  FROM account a LEFT JOIN ledger_entry e ON e.account_id = a.account_id
 WHERE %(account_ids)s::varchar[] IS NULL OR a.account_id = ANY(%(account_ids)s::varchar[])
    OR (%(settlement)s AND a.kind = 'SETTLEMENT')
 GROUP BY a.account_id
"""
RECONCILE_PAYOUTS_SQL = """
SELECT p.payout_id::text, p.state, p.rail_reference, p.amount_minor, p.currency,
       EXISTS (SELECT 1 FROM payout_event e
                WHERE e.payout_id = p.payout_id AND e.to_state = 'POSTED'
                  AND e.owner_id LIKE 'operator:%%')
  FROM payout p
 WHERE p.state = ANY(%(states)s)
"""
RECOVERIES_SQL = """
SELECT rail_reference, payout_id::text, amount_minor, currency, status,
       EXTRACT(EPOCH FROM recorded_at)
  FROM rail_recovery
"""


def account_books(
    cursor: Any, *, account_ids: list[str] | None = None, settlement: bool = False
) -> list[tuple[str, int, int]]:
    """(accountId, balance, ledger sum) of every account, or of `account_ids` (and, with
    `settlement`, every settlement account: where their payouts' credits went), read in the
    cursor's own snapshot: balance = ledger sum is the books' invariant."""
    cursor.execute(ACCOUNT_BOOKS_SQL, {"account_ids": account_ids, "settlement": settlement})
    return [(account, int(balance), int(total)) for account, balance, total in cursor.fetchall()]


def payouts_for_reconcile(cursor: Any, *, states: tuple[str, ...]) -> list[tuple]:
    """(payoutId, state, railReference, amountMinor, currency, resolvedPostedByOperator) of
    every payout in one of `states` (the reconciler's snapshot; raw SQL, one read)."""
    cursor.execute(RECONCILE_PAYOUTS_SQL, {"states": list(states)})
    return [
        (pid, state, ref, int(amount), currency, bool(by_operator))
        for pid, state, ref, amount, currency, by_operator in cursor.fetchall()
    ]


def rail_recoveries(cursor: Any) -> list[tuple[str, str | None, int, str, str, float]]:
    """(railReference, payoutId, amountMinor, currency, status, recordedAt epoch) of every rail
    recovery (payments/recovery.py)."""
    cursor.execute(RECOVERIES_SQL)
    return [
        (ref, pid, int(amount), currency, status, float(at))
        for ref, pid, amount, currency, status, at in cursor.fetchall()
    ]
