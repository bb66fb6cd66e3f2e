"""Payout rows: the guarded state transition other apps use (with its history row), and the
plain state read."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from payments.models import QUARANTINED_OR_TERMINAL

if TYPE_CHECKING:
    import uuid


PAYOUT_LOCK_SQL = "SELECT state FROM payout WHERE payout_id = %(payout_id)s FOR UPDATE"


# `from_state` is the state we moved from: the only one allowed, or the one PAYOUT_LOCK_SQL saw
# with the row locked.
TRANSITION_PAYOUT_SQL = """
WITH moved AS (
    UPDATE payout
       SET state = %(to_state)s, updated_at = clock_timestamp()
     WHERE payout_id = %(payout_id)s AND state = %(from_state)s
 RETURNING payout_id
), ev AS (
    INSERT INTO payout_event (payout_id, from_state, to_state, token, owner_id, note, at)
    SELECT moved.payout_id, %(from_state)s, %(to_state)s, %(token)s::bigint, %(owner_id)s,
           %(note)s, clock_timestamp()
      FROM moved
)
SELECT 1 FROM moved
"""


PAYOUT_STATE_SQL = "SELECT state, claim_token FROM payout WHERE payout_id = %(payout_id)s"


def transition_payout(
    cursor: Any,
    *,
    payout_id: uuid.UUID,
    from_states: tuple[str, ...],
    to_state: str,
    token: int | None,
    owner_id: str,
    note: str | None = None,
) -> bool:
    """Move the payout iff its state is one of `from_states`; append its payout_event row.

    Returns False (and writes nothing) if no row moved: wrong state or unknown payout.
    """
    if token is not None and set(from_states) & QUARANTINED_OR_TERMINAL:
        raise ValueError("no token-bearing transition leaves RAIL_AMBIGUOUS or a terminal state")
    if len(from_states) == 1:
        from_state = from_states[0]  # the UPDATE's own row lock and recheck decide; one trip
    else:
        cursor.execute(PAYOUT_LOCK_SQL, {"payout_id": str(payout_id)})
        row = cursor.fetchone()
        if row is None or row[0] not in from_states:
            return False
        from_state = row[0]
    cursor.execute(
        TRANSITION_PAYOUT_SQL,
        {
            "payout_id": str(payout_id),
            "from_state": from_state,
            "to_state": to_state,
            "token": token,
            "owner_id": owner_id,
            "note": note,
        },
    )
    return cursor.fetchone() is not None


def payout_state(cursor: Any, *, payout_id: uuid.UUID) -> tuple[str | None, int | None]:
    """(state, claim token) of the payout now; (None, None) for an unknown payout."""
    cursor.execute(PAYOUT_STATE_SQL, {"payout_id": str(payout_id)})
    row = cursor.fetchone()
    return (row[0], row[1]) if row else (None, None)
