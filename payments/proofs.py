"""X-Fencing-Proof on P2/P3 (ARCHITECTURE decision 15), checked before the service runs.

The proof must have been issued for `payout:{accountId}` of the payout the call touches; the
account is read from paydb first (a payout never changes account, so this read outside the
command's transaction cannot go stale). Verification itself is offline: no lock-server call.
"""

from __future__ import annotations

import uuid

from django.http import HttpRequest

from dlock import proof
from dlock.dbrouter import alias_for
from dlock.errors import not_found
from payments.models import Payout


def require_payout_proof(request: HttpRequest, *, payout_id: uuid.UUID, token: int) -> None:
    """INVALID_TOKEN unless the request's proof binds `token` to the payout's account key."""
    raw = proof.presented(request)
    account_id = (
        Payout.objects.using(alias_for("payments"))
        .filter(payout_id=payout_id)
        .values_list("account_id", flat=True)
        .first()
    )
    if account_id is None:
        raise not_found("payout", str(payout_id))
    proof.verify(raw, key=proof.payout_key(account_id), token=token)
