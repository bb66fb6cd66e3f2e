"""Guarded, audited reversal of a POSTED payout the rail's statement contradicts (ARCHITECTURE
decision 20: the statement is the truth about money that left).

A payout POSTED with a reference the statement lacks (an override before the statement guard
existed, a transfer the rail later took back) keeps `posted_has_one_booked_transfer` red for
good: the ledger says money left that did not. The reversal books it back, never editing a row:

  DEBIT settlement:<ccy>   CREDIT the payout's account   (a `payout_reversal` row owns both)

and moves the payout POSTED → FAILED (its payout_event names the operator). Any transfer the
statement does hold for the payout is then money that left for a FAILED payout: the reconciler
says so (`failed_has_no_booked_transfer`) until it is recorded as a rail recovery.

Guarded by evidence, both required: the reconciler's latest finding for the payout, taken after
it was POSTED, does not list its reference; and the statement, read now by the caller (the ops
command), lacks it or books it for another payout or amount. A reason of at least REASON_MIN
characters. One paydb transaction (the account row, then the payout row: the resolve/post lock
order), audited like every operator step (payments/audit.py); a refusal writes nothing but its
audit.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.contrib.admin.models import ADDITION
from django.db import connections, transaction
from django.db.models import F
from django.db.models.functions import Now

from dlock.dbrouter import alias_for
from dlock.errors import ApiError, Code
from payments import audit
from payments.fenced_sql import account as account_sql
from payments.fenced_sql import payout as payout_sql
from payments.models import (
    Account,
    AccountKind,
    LedgerEntry,
    Payout,
    PayoutEvent,
    PayoutReconciliation,
    PayoutReversal,
)
from payments.services import settlement_account_id

if TYPE_CHECKING:
    from collections.abc import Callable

    from django.contrib.auth.base_user import AbstractBaseUser

    from payments.recovery import StatementTransfer

REASON_MIN = 8


@dataclass(frozen=True)
class Reversal:
    """What the operator did (the log event's and --json's fields)."""

    reversal_id: str
    payout_id: str
    account_id: str
    rail_reference: str | None
    amount_minor: int
    currency: str
    operator: str
    reason: str
    classification: str
    statement_references: list[str]
    entries: list[dict[str, Any]]

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": True,
            "action": "REVERSED",
            "reversalId": self.reversal_id,
            "payoutId": self.payout_id,
            "accountId": self.account_id,
            "railReference": self.rail_reference,
            "amountMinor": self.amount_minor,
            "currency": self.currency,
            "fromState": "POSTED",
            "toState": "FAILED",
            "operator": self.operator,
            "reason": self.reason,
            "classification": self.classification,
            "statementReferences": self.statement_references,
            "entries": self.entries,
        }


class _Refused(Exception):
    pass


def reverse_payout(
    *,
    payout_id: uuid.UUID,
    reason: str,
    user: AbstractBaseUser,
    read_statement: Callable[[str], StatementTransfer | None],
) -> Reversal:
    """Reverse one POSTED payout the statement contradicts (module docstring). Refused
    (ApiError VALIDATION_FAILED, details.reason; audited) otherwise."""
    reason = (reason or "").strip()
    operator = user.get_username()
    alias = alias_for("payments")
    try:
        with transaction.atomic(using=alias):
            done = _reverse(payout_id, reason, operator, read_statement, alias)
            audit.log_entry(
                user=user,
                model=Payout,
                object_id=done.payout_id,
                text=(
                    f"reversed POSTED → FAILED (reference {done.rail_reference} not on the "
                    f"rail's statement; reconciler {done.classification}): {done.amount_minor} "
                    f"{done.currency} back to {done.account_id}; {reason}"
                ),
                alias=alias,
            )
            audit.log_entry(
                user=user,
                model=PayoutReversal,
                object_id=done.reversal_id,
                object_repr=f"reversal of {done.payout_id}",
                text=f"reversal of payout {done.payout_id}: {reason}",
                flag=ADDITION,
                alias=alias,
            )
            audit.done(
                "payout_reversed",
                level=logging.WARNING,
                alias=alias,
                reversalId=done.reversal_id,
                payoutId=done.payout_id,
                railReference=done.rail_reference,
                amountMinor=done.amount_minor,
                currency=done.currency,
                operator=operator,
                reason=reason,
                classification=done.classification,
            )
        return done
    except _Refused as exc:
        exists = Payout.objects.using(alias).filter(payout_id=payout_id).exists()
        audit.refused(
            "payout_reversal_refused",
            operator=operator,
            user=user,
            action="reverse POSTED",
            reason=str(exc),
            model=Payout if exists else None,
            object_type="payout",
            object_id=str(payout_id),
            note=reason,
            payoutId=str(payout_id),
        )
        raise ApiError(
            Code.VALIDATION_FAILED,
            f"refused: {exc}",
            details={"reason": str(exc), "payoutId": str(payout_id)},
        ) from None


def _reverse(
    payout_id: uuid.UUID,
    reason: str,
    operator: str,
    read_statement: Callable[[str], StatementTransfer | None],
    alias: str,
) -> Reversal:
    if len(reason) < REASON_MIN:
        raise _Refused(f"a reason of at least {REASON_MIN} characters is required")
    payout = Payout.objects.using(alias).filter(payout_id=payout_id).first()
    if payout is None:
        raise _Refused(f"no payout {payout_id}")
    with connections[alias].cursor() as cur:
        account_sql.lock_account(cur, account_id=payout.account_id)
    payout = Payout.objects.using(alias).select_for_update().get(payout_id=payout_id)
    if payout.state != "POSTED":
        raise _Refused(f"payout {payout_id} is {payout.state}; only a POSTED payout is reversed")
    reference = payout.rail_reference
    recon, on_statement = _contradicted(payout, read_statement, alias)
    reversal = PayoutReversal.objects.using(alias).create(
        payout=payout,
        rail_reference=reference,
        amount_minor=payout.amount_minor,
        currency=payout.currency,
        classification=recon.classification,
        statement_references=on_statement,
        reason=reason,
        reversed_by=operator,
    )
    entries = _book(alias, reversal=reversal, account_id=payout.account_id)
    with connections[alias].cursor() as cur:
        moved = payout_sql.transition_payout(
            cur,
            payout_id=payout_id,
            from_states=("POSTED",),
            to_state="FAILED",
            token=None,
            owner_id=f"operator:{operator}"[:64],
            note=f"REVERSED ({reference} not on the rail's statement): {reason}",
        )
    if not moved:  # pragma: no cover - the payout row is locked above
        raise _Refused(f"payout {payout_id} is no longer POSTED")
    return Reversal(
        reversal_id=str(reversal.reversal_id),
        payout_id=str(payout_id),
        account_id=payout.account_id,
        rail_reference=reference,
        amount_minor=int(payout.amount_minor),
        currency=payout.currency,
        operator=operator,
        reason=reason,
        classification=recon.classification,
        statement_references=on_statement,
        entries=entries,
    )


def _contradicted(
    payout: Payout, read_statement: Callable[[str], StatementTransfer | None], alias: str
) -> tuple[PayoutReconciliation, list[str]]:
    """The guard: the reconciler's finding, taken after the post, lacks the payout's reference,
    and the statement read now does not book it for this payout and amount. Returns the
    finding and the references the statement held instead."""
    payout_id = payout.payout_id
    reference = payout.rail_reference
    posted = (
        PayoutEvent.objects.using(alias)
        .filter(payout_id=payout_id, to_state="POSTED")
        .order_by("-at", "-id")
        .first()
    )
    recon = PayoutReconciliation.objects.using(alias).filter(payout_id=payout_id).first()
    if recon is None or (posted is not None and recon.checked_at < posted.at):
        raise _Refused(
            "the reconciler has no finding for this payout since it was POSTED "
            "(run manage.py reconcile; a POSTED payout it finds contradicted gets one)"
        )
    on_statement = [str(r) for r in recon.rail_references or []]
    if reference in on_statement:
        raise _Refused(
            f"the reconciler found reference {reference} on the rail's statement for this "
            "payout: the money left; a transfer beyond it is a rail recovery "
            "(manage.py record_rail_recovery), not a reversal"
        )
    row = read_statement(reference) if reference else None
    if (
        row is not None
        and row.client_ref == str(payout_id)
        and (
            row.amount_minor,
            row.currency,
        )
        == (payout.amount_minor, payout.currency)
    ):
        raise _Refused(
            f"the rail's statement, read now, has reference {reference} for this payout "
            "(the reconciler's finding is older): run manage.py reconcile"
        )
    return recon, on_statement


def _book(alias: str, *, reversal: PayoutReversal, account_id: str) -> list[dict[str, Any]]:
    """DEBIT settlement (its row: an operator step, like a recovery's), CREDIT the account;
    both balances move (balance = Σ CREDIT − Σ DEBIT)."""
    amount, currency = int(reversal.amount_minor), reversal.currency
    settlement = settlement_account_id(currency)
    Account.objects.using(alias).get_or_create(
        account_id=settlement, defaults={"currency": currency, "kind": AccountKind.SETTLEMENT}
    )
    entries = []
    for target, direction, sign in ((settlement, "DEBIT", -1), (account_id, "CREDIT", 1)):
        Account.objects.using(alias).filter(account_id=target).update(
            balance_minor=F("balance_minor") + sign * amount, updated_at=Now()
        )
        entry = LedgerEntry.objects.using(alias).create(
            reversal=reversal, account_id=target, direction=direction, amount_minor=amount, fence=0
        )
        entries.append(
            {
                "entryId": str(entry.entry_id),
                "accountId": target,
                "direction": direction,
                "amountMinor": amount,
            }
        )
    return entries
