"""One pipeline for an operator's money actions: resolve (payments/resolve.py), rail recovery
record and close (payments/recovery.py) and reversal (payments/reversal.py) plug into `run`
with only their guards and effects.

  1. the action's input rules come first, in its own function, before any row is read: a bad
     input (a form's or a flag's mistake) is ApiError VALIDATION_FAILED and is not audited;
  2. `Action.target` finds the payout the action is about, unlocked: input that names nothing
     is ApiError NOT_FOUND, not audited either; a guard it can already answer raises `Refused`;
  3. one paydb transaction takes the locks in claim/post's order, the payout's account row, then
     the payout row (`lock_payout`); `Action.apply` locks its own rows after them, guards, and
     writes its effects (ledger legs through `book`), returning a `Done`;
  4. the audit, in that transaction: the `Done`'s admin History rows (LogEntry) and its JSON
     event once the transaction commits (payments.audit);
  5. a `Refused` anywhere in 2-3 rolls the action back and is recorded once
     (payments.audit.refused: an `operator_refusal` row, a LogEntry on the payout when one is
     known, else on the action's own object, and the action's WARNING `*_refused` event).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.contrib.admin.models import CHANGE
from django.db import connections, transaction
from django.db.models import F
from django.db.models.functions import Now

from dlock.dbrouter import alias_for
from dlock.errors import ApiError, Code
from payments import audit
from payments.fenced_sql.account import lock_account
from payments.models import Account, LedgerEntry, Payout

if TYPE_CHECKING:
    import uuid
    from collections.abc import Callable

    from django.contrib.auth.base_user import AbstractBaseUser
    from django.db.models import Model


class Refused(ApiError):
    """An operator's money action refused on a real object: nothing written but its audit.

    An ApiError (VALIDATION_FAILED unless the guard names another code) whose details carry
    the `reason`; `payout_id` is where its History row goes, when the refusal knows it."""

    def __init__(
        self,
        reason: str,
        payout_id: str | None = None,
        *,
        code: Code = Code.VALIDATION_FAILED,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(code, f"refused: {reason}", details={"reason": reason, **(details or {})})
        self.reason = reason
        self.payout_id = payout_id


@dataclass(frozen=True)
class History:
    """One admin History row (a Django LogEntry) an action leaves on an object it touched."""

    model: type[Model]
    object_id: str
    text: str
    object_repr: str | None = None
    flag: int = CHANGE


@dataclass(frozen=True)
class Done:
    """What an operator's money action did: its fields (camelCase: the commands' --json, and
    the event's unless `event_fields` says otherwise), its event and its History rows."""

    event: str
    fields: dict[str, Any]
    history: tuple[History, ...]
    level: int = logging.WARNING
    event_fields: dict[str, Any] | None = None

    def __getitem__(self, name: str) -> Any:
        return self.fields[name]

    def as_dict(self) -> dict[str, Any]:
        return {"ok": True, **self.fields}


@dataclass(frozen=True)
class Action:
    """One operator money action as the pipeline runs it.

    `target(alias)` → the payout it is about (None: the action has none), unlocked;
    `apply(cursor, payout, operator)` → Done, under the locks; both raise Refused.
    The rest describes its refusal: the action's words, its event, the note the operator gave,
    the object a refusal with no payout is logged on, and the fields that identify it."""

    name: str
    refused_event: str
    target: Callable[[str], Payout | None]
    apply: Callable[[Any, Payout | None, str], Done]
    note: str
    object_model: type[Model]
    object_id: str
    ids: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


def run(action: Action, *, user: AbstractBaseUser) -> Done:
    """Find, lock, guard, apply and audit one action (module docstring). Raises Refused (after
    recording it) or the target's ApiError (not recorded: the input named nothing)."""
    alias = alias_for("payments")
    operator = user.get_username()
    try:
        with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
            payout = lock_payout(cursor, action.target(alias), alias=alias)
            done = action.apply(cursor, payout, operator)
            for row in done.history:
                audit.log_entry(
                    user=user,
                    model=row.model,
                    object_id=row.object_id,
                    object_repr=row.object_repr,
                    text=row.text,
                    flag=row.flag,
                    alias=alias,
                )
            audit.done(
                done.event,
                level=done.level,
                alias=alias,
                **(done.event_fields if done.event_fields is not None else done.fields),
            )
    except Refused as refused:
        _record(action, refused, user=user, operator=operator)
        if refused.details is not None:
            refused.details = {**refused.details, **action.ids}
        raise
    return done


def _record(action: Action, refused: Refused, *, user: AbstractBaseUser, operator: str) -> None:
    on_payout = refused.payout_id is not None
    audit.refused(
        action.refused_event,
        operator=operator,
        user=user,
        action=action.name,
        reason=refused.reason,
        model=Payout if on_payout else action.object_model,
        object_type="payout" if on_payout else str(action.object_model._meta.verbose_name),
        object_id=str(refused.payout_id) if on_payout else action.object_id,
        note=action.note,
        code=refused.code.value,
        **{**action.ids, "payoutId": refused.payout_id or action.ids.get("payoutId")},
        **action.extra,
    )


def find_payout(payout_id: uuid.UUID | str, alias: str) -> Payout:
    """The payout an action names, unlocked; NOT_FOUND (not audited) when it exists nowhere."""
    payout = Payout.objects.using(alias).filter(payout_id=payout_id).first()
    if payout is None:
        raise ApiError(
            Code.NOT_FOUND,
            f"no payout {payout_id}",
            details={"resource": "payout", "id": str(payout_id)},
        )
    return payout


def lock_payout(cursor: Any, payout: Payout | None, *, alias: str) -> Payout | None:
    """The payout, row-locked after its account row: claim/post's lock order, so an operator
    step never deadlocks a worker's claim or post of the same account."""
    if payout is None:
        return None
    lock_account(cursor, account_id=payout.account_id)
    return Payout.objects.using(alias).select_for_update().get(payout_id=payout.payout_id)


def book(
    alias: str,
    *,
    owner: dict[str, Model],
    amount_minor: int,
    currency: str,
    debit: tuple[str, str],
    credit: tuple[str, str],
) -> list[dict[str, Any]]:
    """Two ledger legs owned by the action's row (`owner`: {"recovery": r} or {"reversal": r}),
    each (account id, kind) created when missing; both balances move (balance = Σ CREDIT −
    Σ DEBIT). A settlement leg moves the account row itself, never P3's buckets: its balance is
    the row plus its buckets (selectors.balance_sql), and an operator step is too rare to
    spread."""
    entries = []
    for (account_id, kind), direction, sign in ((debit, "DEBIT", -1), (credit, "CREDIT", 1)):
        Account.objects.using(alias).get_or_create(
            account_id=account_id, defaults={"currency": currency, "kind": kind}
        )
        Account.objects.using(alias).filter(account_id=account_id).update(
            balance_minor=F("balance_minor") + sign * amount_minor, updated_at=Now()
        )
        entry = LedgerEntry.objects.using(alias).create(
            **owner, account_id=account_id, direction=direction, amount_minor=amount_minor, fence=0
        )
        entries.append(
            {
                "entryId": str(entry.entry_id),
                "accountId": account_id,
                "direction": direction,
                "amountMinor": amount_minor,
            }
        )
    return entries
