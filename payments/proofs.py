"""X-Fencing-Proof on P2/P3 (ARCHITECTURE decision 15), checked before the service runs.

The proof must have been issued for `payout:{accountId}` of the payout the call touches; the
account is read from paydb the first time a process sees the payout and kept (a payout never
changes account, so neither the read outside the command's transaction nor the kept value can go
stale). Verification itself is offline: no lock-server call.
"""

from __future__ import annotations

import uuid

from django.db import connections
from django.http import HttpRequest

from dlock import proof
from dlock.dbrouter import alias_for
from dlock.memo import WriteOnceMap

# One round trip without the ORM's query compilation (docs/CHANGELOG.md), and only the first
# time this process sees the payout.
ACCOUNT_OF_PAYOUT_SQL = "SELECT account_id FROM payout WHERE payout_id = %s"
_accounts = WriteOnceMap()  # payout id → account id


def account_of_payout(payout_id: uuid.UUID) -> str | None:
    """The account a payout belongs to, or None for an unknown payout."""
    return _accounts.get_or_read(payout_id, _read_account)


def _read_account(payout_id: uuid.UUID) -> str | None:
    with connections[alias_for("payments")].cursor() as cursor:
        cursor.execute(ACCOUNT_OF_PAYOUT_SQL, [payout_id])
        row = cursor.fetchone()
    return row[0] if row else None


def require_payout_proof(request: HttpRequest, *, payout_id: uuid.UUID, token: int) -> None:
    """INVALID_TOKEN unless the request's proof binds `token` to the payout's account key."""
    proof.require_for_payout(
        request, payout_id=payout_id, token=token, account_of=account_of_payout
    )
