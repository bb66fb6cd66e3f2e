"""A rail recovery step's trail: the step itself (`RecoveryStep`), its two ledger legs, and
its audit (LogEntry rows on the recovery and its payout, the JSON event, the refusal record).
payments/recovery.py decides and calls these inside its one transaction per step."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.contrib.admin.models import CHANGE
from django.db.models import F
from django.db.models.functions import Now

from dlock.errors import ApiError, Code
from payments import audit
from payments.models import Account, LedgerEntry, Payout, RailRecovery

if TYPE_CHECKING:
    from django.contrib.auth.base_user import AbstractBaseUser


@dataclass(frozen=True)
class RecoveryStep:
    """What an operator did to one rail recovery (the log event's and --json's fields)."""

    action: str  # RECORDED, RECOVERED, WRITTEN_OFF
    recovery_id: str
    rail_reference: str
    payout_id: str | None
    amount_minor: int
    currency: str
    status: str
    operator: str
    reference: str | None
    note: str
    classification: str | None
    entries: list[dict[str, Any]]

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": True,
            "action": self.action,
            "recoveryId": self.recovery_id,
            "railReference": self.rail_reference,
            "payoutId": self.payout_id,
            "amountMinor": self.amount_minor,
            "currency": self.currency,
            "status": self.status,
            "operator": self.operator,
            "reference": self.reference,
            "note": self.note,
            "classification": self.classification,
            "entries": self.entries,
        }


class Refused(Exception):
    def __init__(self, reason: str, payout_id: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.payout_id = payout_id


def cursor_on(alias: str) -> Any:
    from django.db import connections

    return connections[alias].cursor()


def book_legs(
    alias: str,
    *,
    recovery: RailRecovery,
    debit: tuple[str, str],
    credit: tuple[str, str],
) -> list[dict[str, Any]]:
    """Two balanced legs on the recovery and both balance moves (balance = Σ CREDIT − Σ DEBIT).
    The accounts are created on demand; operator legs carry fence 0 (no token is involved).
    A settlement leg moves the account row itself, never P3's buckets: its balance is the row
    plus its buckets (selectors.balance_sql), and an operator step is too rare to spread."""
    amount = int(recovery.amount_minor)
    entries = []
    for (account_id, kind), direction, sign in ((debit, "DEBIT", -1), (credit, "CREDIT", 1)):
        Account.objects.using(alias).get_or_create(
            account_id=account_id, defaults={"currency": recovery.currency, "kind": kind}
        )
        Account.objects.using(alias).filter(account_id=account_id).update(
            balance_minor=F("balance_minor") + sign * amount, updated_at=Now()
        )
        entry = LedgerEntry.objects.using(alias).create(
            recovery=recovery,
            account_id=account_id,
            direction=direction,
            amount_minor=amount,
            fence=0,
        )
        entries.append(
            {
                "entryId": str(entry.entry_id),
                "accountId": account_id,
                "direction": direction,
                "amountMinor": amount,
            }
        )
    return entries


def describe(step: RecoveryStep) -> str:
    """The LogEntry text (plain, so the admin History shows it as written)."""
    what = {
        "RECORDED": f"rail recovery recorded for transfer {step.rail_reference}",
        "RECOVERED": f"rail recovery of transfer {step.rail_reference} closed RECOVERED "
        f"(rail reference {step.reference})",
        "WRITTEN_OFF": f"rail recovery of transfer {step.rail_reference} closed WRITTEN_OFF",
    }[step.action]
    return f"{what}: {step.amount_minor} {step.currency}; {step.note}"[:2000]


def log_entries(step: RecoveryStep, *, user: AbstractBaseUser, alias: str, flag: int) -> None:
    rows = [(RailRecovery, step.recovery_id, f"{step.rail_reference} ({step.status})", flag)]
    if step.payout_id:
        rows.append((Payout, step.payout_id, step.payout_id, CHANGE))
    for model, object_id, text, action in rows:
        audit.log_entry(
            user=user,
            model=model,
            object_id=object_id,
            object_repr=text,
            text=describe(step),
            flag=action,
            alias=alias,
        )


def record_refusal(
    action: str,
    rail_reference: str,
    refused: Refused,
    *,
    user: AbstractBaseUser,
    alias: str,
    note: str,
    extra: dict[str, Any],
) -> None:
    """A refused step (payments.audit.refused): its LogEntry on the payout when known, else on
    the recovery model under the transfer's reference."""
    model, object_id = (
        (Payout, refused.payout_id) if refused.payout_id else (RailRecovery, rail_reference)
    )
    audit.refused(
        "rail_recovery_refused",
        operator=user.get_username(),
        user=user,
        action=f"{action} rail recovery {rail_reference}",
        reason=refused.reason,
        model=model,
        object_type="payout" if refused.payout_id else "rail recovery",
        object_id=object_id,
        note=note,
        railReference=rail_reference,
        payoutId=refused.payout_id,
        **extra,
    )


def refused_error(rail_reference: str, refused: Refused) -> ApiError:
    return ApiError(
        Code.VALIDATION_FAILED,
        f"refused: {refused.reason}",
        details={"reason": refused.reason, "railReference": rail_reference},
    )


def log_done(step: RecoveryStep, alias: str) -> None:
    audit.done(
        f"rail_recovery_{step.action.lower()}",
        level=logging.WARNING,
        alias=alias,
        recoveryId=step.recovery_id,
        railReference=step.rail_reference,
        payoutId=step.payout_id,
        amountMinor=step.amount_minor,
        currency=step.currency,
        status=step.status,
        operator=step.operator,
        reference=step.reference,
        note=step.note,
        classification=step.classification,
    )
