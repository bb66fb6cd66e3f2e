"""X-Fencing-Proof on rail submissions (ARCHITECTURE decision 15), checked before admission.

The proof must have been issued for `payout:{accountId}` of the payout as paydb stores it (not
the body's accountId, which admission compares later); read the first time this process sees
the payout and kept (a payout never changes account); verification is offline.
"""

from __future__ import annotations

import uuid

from django.db import connections
from django.http import HttpRequest

from dlock import proof
from dlock.dbrouter import alias_for
from dlock.memo import WriteOnceMap
from railproxy import fenced_sql

_accounts = WriteOnceMap()  # payout id → account id


def account_of(payout_id: uuid.UUID) -> str | None:
    """The payout's account as paydb stores it, or None for an unknown payout."""
    return _accounts.get_or_read(payout_id, _read_account)


def _read_account(payout_id: uuid.UUID) -> str | None:
    with connections[alias_for("railproxy")].cursor() as cursor:
        stored = fenced_sql.payout(cursor, payout_id=payout_id)
    return stored.account_id if stored else None


def require_payout_proof(request: HttpRequest, *, payout_id: uuid.UUID, token: int) -> None:
    """INVALID_TOKEN unless the request's proof binds `token` to the payout's account key."""
    proof.require_for_payout(request, payout_id=payout_id, token=token, account_of=account_of)
