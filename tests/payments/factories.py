"""Small factories and HTTP helpers for the payment-resource tests (fresh ids every call)."""

from __future__ import annotations

import itertools
import json
import uuid

from django.db import connection
from prometheus_client import REGISTRY

from dlock import proof
from payments import seeding, selectors
from payments.models import (
    Account,
    IdempotencyRecord,
    LedgerEntry,
    Payout,
    PayoutEvent,
    SettlementBucket,
)

_tokens = itertools.count(1_000)


def next_token() -> int:
    """Monotonic per test process; ordering is all the payment resource cares about."""
    return next(_tokens)


def account(balance: int = 10_000, currency: str = "EUR") -> Account:
    return seeding.create_account(
        account_id=f"acct-{uuid.uuid4().hex[:16]}",
        currency=currency,
        opening_balance_minor=balance,
    )


def payout(acct: Account, amount: int = 1_000, state: str = "PENDING") -> Payout:
    p = seeding.create_payout(account_id=acct.account_id, amount_minor=amount)
    if state != "PENDING":
        Payout.objects.filter(payout_id=p.payout_id).update(state=state)
        p.refresh_from_db()
    return p


def rail_acked(p: Payout) -> None:
    """Stand-in for the rail proxy: CLAIMED → RAIL_ACKED (direct SQL, not part of P1–P5)."""
    Payout.objects.filter(payout_id=p.payout_id).update(state="RAIL_ACKED")


_SIGNED = object()  # default: the proof the lock server would have issued for this payout


def fence_proof(acct_id: str, token: int) -> str:
    """What L4 would answer as fencingProof for a grant of `payout:{acct_id}` with `token`."""
    return proof.sign(key=proof.payout_key(acct_id), token=token)


def headers(token, owner="w1", key=None, p: Payout | None = None, fproof=_SIGNED) -> dict[str, str]:
    h: dict[str, str] = {}
    if token is not None:
        h["X-Fencing-Token"] = str(token)
    if fproof is _SIGNED:
        fproof = fence_proof(p.account_id, int(token)) if p and str(token).isdigit() else None
    if fproof is not None:
        h["X-Fencing-Proof"] = fproof
    if owner is not None:
        h["X-Owner-Id"] = owner
    if key is not None:
        h["X-Idempotency-Key"] = key
    elif p is not None:
        h["X-Idempotency-Key"] = p.idempotency_key
    return h


def claim(
    client,
    p: Payout,
    token,
    *,
    owner="w1",
    key=None,
    body=None,
    expected="PENDING",
    fproof=_SIGNED,
):
    return client.post(
        f"/v1/payouts/{p.payout_id}/claim",
        data=json.dumps(body if body is not None else {"expectedState": expected}),
        content_type="application/json",
        headers=headers(token, owner, key, p, fproof),
    )


def post(client, p: Payout, token, *, owner="w1", key=None, body=None, fproof=_SIGNED):
    default = {"railReference": f"rr-{uuid.uuid4().hex[:8]}", "submissionId": str(uuid.uuid4())}
    return client.post(
        f"/v1/payouts/{p.payout_id}/post",
        data=json.dumps(body if body is not None else default),
        content_type="application/json",
        headers=headers(token, owner, key, p, fproof),
    )


def fenced_count(resource: str = "account") -> float:
    return REGISTRY.get_sample_value("lock_fenced_out_total", {"resource": resource}) or 0.0


def fenced_sample(resource: str) -> float | None:
    """The series itself: None if no such labelled series was ever created."""
    return REGISTRY.get_sample_value("lock_fenced_out_total", {"resource": resource})


def snapshot(p: Payout) -> dict:
    """Every row a command could touch for this payout and its account."""
    acct = Account.objects.get(account_id=p.account_id)
    row = Payout.objects.get(payout_id=p.payout_id)
    return {
        "state": row.state,
        "attempt": row.attempt_count,
        "claim_token": row.claim_token,
        "balance": acct.balance_minor,
        "fence": acct.fence,
        "events": PayoutEvent.objects.filter(payout_id=p.payout_id).count(),
        "entries": LedgerEntry.objects.filter(payout_id=p.payout_id).count(),
        "idem": IdempotencyRecord.objects.filter(payout_id=p.payout_id).count(),
        "settlement": balance(f"settlement:{acct.currency}"),
        "buckets": sorted(
            SettlementBucket.objects.filter(account_id=f"settlement:{acct.currency}").values_list(
                "bucket", "balance_minor"
            )
        ),
    }


def books(account_ids: list[str] | None = None) -> list[tuple[str, int, int]]:
    """(accountId, balance, ledger sum) as the reconciler reads them (payments.selectors)."""
    with connection.cursor() as cur:
        return selectors.account_books(cur, account_ids=account_ids)


def balance(account_id: str) -> int | None:
    """The account's balance as every reader sees it (its row plus any settlement buckets);
    None for no such account."""
    found = books([account_id])
    return found[0][1] if found else None
