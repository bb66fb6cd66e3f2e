"""Rail recoveries: guarded, audited operator booking of rail transfers no POSTED payout
accounts for (ARCHITECTURE decision 20). The admin and the ops commands both call these.

The rail's statement is the truth about money that left. A transfer beyond the one a POSTED
payout accounts for (a duplicate ack), or the booked transfer of a payout resolved FAILED, is
recorded from the reconciler's evidence (its `payout_reconciliation` finding lists the
transfer with its amount) and booked:

  record     DEBIT recoverable:rail:<ccy>   CREDIT settlement:<ccy>      (money left)
  RECOVERED  DEBIT settlement:<ccy>         CREDIT recoverable:rail:<ccy> (money came back)
  WRITTEN_OFF DEBIT loss:rail:<ccy>         CREDIT recoverable:rail:<ccy>

Each step runs through the operators' one pipeline (payments/operator_action.py): one paydb
transaction with the payout's account and payout rows locked first, the recovery row, both
ledger legs with both balances, a `rail_recovery_event` row and Django LogEntry rows (on the
recovery and on its payout, so both admin History pages show it); a JSON log event after the
commit. A refusal changes nothing, and is itself audited: a `rail_recovery_refused` WARNING
event, an `operator_refusal` row and a LogEntry. A bad input (`check_record`, `check_close`)
or a transfer with no recovery to close is an error of the request, not audited. Nothing here
is automatic: only an operator calls it; the reconciler writes no ledger rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from django.contrib.admin.models import ADDITION, CHANGE
from django.db import IntegrityError, transaction
from django.db.models.functions import Now

from dlock.dbrouter import alias_for
from dlock.errors import ApiError, Code, validation_error
from dlock.timefmt import rfc3339_ms
from payments import operator_action
from payments.models import (
    AccountKind,
    Payout,
    PayoutReconciliation,
    RailRecovery,
    RailRecoveryEvent,
)
from payments.operator_action import Action, Done, History, Refused, book
from payments.services import settlement_account_id

if TYPE_CHECKING:
    import uuid

    from django.contrib.auth.base_user import AbstractBaseUser

REASON_MIN = 8
# A payout in one of these is still on the automated path: its transfers are not yet settled.
IN_FLIGHT_STATES = ("PENDING", "CLAIMED", "SUBMITTING", "RAIL_ACKED")
CLOSE_OUTCOMES = ("RECOVERED", "WRITTEN_OFF")


def recoverable_account_id(currency: str) -> str:
    return f"recoverable:rail:{currency}"


def loss_account_id(currency: str) -> str:
    return f"loss:rail:{currency}"


@dataclass(frozen=True)
class StatementTransfer:
    """One row of the rail's statement (raildb `rail_transfer`), as evidence."""

    rail_reference: str
    client_ref: str
    amount_minor: int
    currency: str


def evidence_for(rail_reference: str) -> tuple[PayoutReconciliation, dict[str, Any]] | None:
    """The reconciler's latest finding that lists this transfer, and the transfer in it."""
    alias = alias_for("payments")
    recon = (
        PayoutReconciliation.objects.using(alias)
        .filter(rail_references__contains=[rail_reference])
        .first()
    )
    if recon is None:
        return None
    for transfer in recon.rail_transfers or []:
        if transfer.get("railReference") == rail_reference:
            return recon, transfer
    return None


def check_record(*, rail_reference: str, reason: str) -> None:
    """The record's own rules, before any row is read (VALIDATION_FAILED, not audited)."""
    if not rail_reference:
        raise validation_error(
            "a rail reference (--transfer) is required",
            [{"field": "transfer", "message": "required"}],
        )
    check_reason(reason)


def check_reason(reason: str) -> None:
    """A recovery's reason: at least REASON_MIN characters (VALIDATION_FAILED, not audited)."""
    if len(reason) < REASON_MIN:
        raise validation_error(
            f"a reason of at least {REASON_MIN} characters is required",
            [{"field": "reason", "message": f">= {REASON_MIN} characters"}],
        )


def record_recovery(
    *,
    rail_reference: str,
    reason: str,
    user: AbstractBaseUser,
    statement_read: bool = False,
    statement: StatementTransfer | None = None,
) -> Done:
    """Record one rail transfer as a recovery and book it (module docstring), through the
    operators' pipeline (payments/operator_action.py).

    A bad input (no reference, a short reason) is VALIDATION_FAILED, not audited. Refused
    (recorded) when the transfer already has a recovery, the reconciler has not seen it on the
    statement, the caller read the statement itself (`statement_read`, the ops commands) and
    `statement` is None or disagrees, the payout is still in flight, or it is the very
    transfer a POSTED payout accounts for.
    """
    rail_reference = (rail_reference or "").strip()
    reason = (reason or "").strip()
    check_record(rail_reference=rail_reference, reason=reason)
    return operator_action.run(
        Action(
            name=f"record rail recovery {rail_reference}",
            refused_event="rail_recovery_refused",
            target=partial(_recordable, rail_reference, statement if statement_read else False),
            apply=partial(_record, rail_reference=rail_reference, reason=reason),
            note=reason,
            object_model=RailRecovery,
            object_id=rail_reference,
            ids={"railReference": rail_reference},
        ),
        user=user,
    )


def _recordable(
    rail_reference: str,
    statement: StatementTransfer | None | bool,  # False: not read by the caller
    alias: str,
) -> Payout:
    """The guards before any lock: no recovery yet, on the statement, seen by the reconciler
    with the statement's payout and amount. Returns the finding's payout."""
    existing = RailRecovery.objects.using(alias).filter(rail_reference=rail_reference).first()
    if existing is not None:
        raise Refused(
            f"transfer {rail_reference} already has a recovery ({existing.status}, recorded "
            f"by {existing.recorded_by})",
            str(existing.payout_id) if existing.payout_id else None,
        )
    if statement is None:
        raise Refused(f"transfer {rail_reference} is not on the rail's statement")
    found = evidence_for(rail_reference)
    if found is None:
        raise Refused(
            f"the reconciler has not seen transfer {rail_reference} on the rail's statement "
            "(run manage.py reconcile)"
        )
    recon, transfer = found
    payout_id = str(recon.payout_id)
    amount, currency = int(transfer["amountMinor"]), str(transfer["currency"])
    if isinstance(statement, StatementTransfer) and (
        statement.client_ref != payout_id
        or (statement.amount_minor, statement.currency) != (amount, currency)
    ):
        raise Refused(
            f"the rail's statement ({statement.client_ref}, {statement.amount_minor} "
            f"{statement.currency}) disagrees with the reconciler's finding ({payout_id}, "
            f"{amount} {currency}); run manage.py reconcile",
            payout_id,
        )
    return Payout.objects.using(alias).get(payout_id=recon.payout_id)


def _record(
    cursor: Any, payout: Payout | None, operator: str, *, rail_reference: str, reason: str
) -> Done:
    """Under the account and payout row locks: the payout's state guards, then the recovery
    row, its two legs and its event row."""
    assert payout is not None  # _recordable found it
    alias = alias_for("payments")
    found = evidence_for(rail_reference)
    assert found is not None  # _recordable read it; findings are only ever rewritten
    recon, transfer = found
    payout_id = str(payout.payout_id)
    amount, currency = int(transfer["amountMinor"]), str(transfer["currency"])
    if payout.state in IN_FLIGHT_STATES:
        raise Refused(
            f"payout {payout_id} is {payout.state}, still on the automated path; record a "
            "recovery once it is POSTED, FAILED, ABANDONED or RAIL_AMBIGUOUS",
            payout_id,
        )
    if payout.state == "POSTED" and payout.rail_reference == rail_reference:
        raise Refused(
            f"transfer {rail_reference} is the one payout {payout_id} (POSTED) accounts for; "
            "only a transfer beyond it is a recovery",
            payout_id,
        )
    try:
        with transaction.atomic(using=alias):
            recovery = RailRecovery.objects.using(alias).create(
                rail_reference=rail_reference,
                client_ref=payout_id,
                payout_id=payout.payout_id,
                amount_minor=amount,
                currency=currency,
                classification=recon.classification,
                reason=reason,
                recorded_by=operator,
            )
    except IntegrityError:  # a concurrent record of the same transfer won (UNIQUE)
        raise Refused(f"transfer {rail_reference} already has a recovery", payout_id) from None
    entries = book(
        alias,
        owner={"recovery": recovery},
        amount_minor=amount,
        currency=currency,
        debit=(recoverable_account_id(currency), AccountKind.RECOVERABLE),
        credit=(settlement_account_id(currency), AccountKind.SETTLEMENT),
    )
    RailRecoveryEvent.objects.using(alias).create(
        recovery=recovery, action="RECORDED", operator=operator, note=reason
    )
    return _done(
        recovery,
        action="RECORDED",
        operator=operator,
        reference=None,
        note=reason,
        entries=entries,
        flag=ADDITION,
    )


def check_close(*, outcome: str, reference: str | None, reason: str) -> None:
    """The close's own rules, before any row is read (VALIDATION_FAILED, not audited): an
    outcome, RECOVERED with the rail's reference of the return, WRITTEN_OFF with a reason and
    no reference."""
    if outcome not in CLOSE_OUTCOMES:
        raise validation_error(
            "a recovery closes as RECOVERED or WRITTEN_OFF",
            [{"field": "outcome", "message": "RECOVERED or WRITTEN_OFF"}],
        )
    if outcome == "RECOVERED" and not reference:
        raise validation_error(
            "RECOVERED needs the rail's reference of the money that came back (--reference)",
            [{"field": "reference", "message": "required with RECOVERED"}],
        )
    if outcome == "WRITTEN_OFF" and reference:
        raise validation_error(
            f"WRITTEN_OFF takes no reference ({reference!r}): money that came back with a rail "
            "reference closes RECOVERED; put a ticket number in the reason",
            [{"field": "reference", "message": "not with WRITTEN_OFF"}],
        )
    if outcome == "WRITTEN_OFF" and len(reason) < REASON_MIN:
        raise validation_error(
            f"WRITTEN_OFF needs a reason of at least {REASON_MIN} characters",
            [{"field": "reason", "message": f">= {REASON_MIN} characters"}],
        )


def close_recovery(
    *,
    rail_reference: str,
    outcome: str,
    user: AbstractBaseUser,
    reference: str | None = None,
    reason: str | None = None,
) -> Done:
    """Close an OPEN recovery as RECOVERED (with the rail's reference of the money that came
    back) or WRITTEN_OFF (with a reason, and no reference), through the operators' pipeline.
    A bad input (`check_close`) is VALIDATION_FAILED and a transfer with no recovery NOT_FOUND,
    neither audited; a recovery closed already is refused, and recorded."""
    rail_reference = (rail_reference or "").strip()
    reference = (reference or "").strip() or None
    reason = (reason or "").strip()
    check_close(outcome=outcome, reference=reference, reason=reason)
    return operator_action.run(
        Action(
            name=f"close rail recovery {rail_reference}",
            refused_event="rail_recovery_refused",
            target=partial(_closable, rail_reference),
            apply=partial(
                _close,
                rail_reference=rail_reference,
                outcome=outcome,
                reference=reference,
                reason=reason,
            ),
            note=reason,
            object_model=RailRecovery,
            object_id=rail_reference,
            ids={"railReference": rail_reference},
            extra={"outcome": outcome, "reference": reference},
        ),
        user=user,
    )


def _closable(rail_reference: str, alias: str) -> Payout | None:
    """The recovery's payout (locked first, as every operator step); NOT_FOUND when the
    transfer has no recovery."""
    recovery = RailRecovery.objects.using(alias).filter(rail_reference=rail_reference).first()
    if recovery is None:
        raise ApiError(
            Code.NOT_FOUND,
            f"no rail recovery for transfer {rail_reference!r}",
            details={"resource": "rail recovery", "id": rail_reference},
        )
    if recovery.payout_id is None:
        return None
    return Payout.objects.using(alias).get(payout_id=recovery.payout_id)


def _close(
    cursor: Any,
    payout: Payout | None,
    operator: str,
    *,
    rail_reference: str,
    outcome: str,
    reference: str | None,
    reason: str,
) -> Done:
    alias = alias_for("payments")
    recovery = (
        RailRecovery.objects.using(alias).select_for_update().get(rail_reference=rail_reference)
    )
    payout_id = str(recovery.payout_id) if recovery.payout_id else None
    if recovery.status != "OPEN":
        raise Refused(
            f"the recovery of transfer {rail_reference} is already {recovery.status} "
            f"(closed by {recovery.closed_by} at {rfc3339_ms(recovery.closed_at)})",
            payout_id,
        )
    # The row is locked; the status predicate still decides (the CHECK backs it).
    moved = (
        RailRecovery.objects.using(alias)
        .filter(recovery_id=recovery.recovery_id, status="OPEN")
        .update(
            status=outcome,
            closed_by=operator,
            closed_at=Now(),
            close_reference=reference if outcome == "RECOVERED" else None,
            close_reason=reason or None,
        )
    )
    if moved != 1:  # pragma: no cover - the row lock above makes this unreachable
        raise Refused(f"the recovery of transfer {rail_reference} is no longer OPEN", payout_id)
    currency = recovery.currency
    debit = (
        (settlement_account_id(currency), AccountKind.SETTLEMENT)
        if outcome == "RECOVERED"
        else (loss_account_id(currency), AccountKind.LOSS)
    )
    entries = book(
        alias,
        owner={"recovery": recovery},
        amount_minor=int(recovery.amount_minor),
        currency=currency,
        debit=debit,
        credit=(recoverable_account_id(currency), AccountKind.RECOVERABLE),
    )
    note = reason or f"recovered with rail reference {reference}"
    RailRecoveryEvent.objects.using(alias).create(
        recovery=recovery, action=outcome, operator=operator, reference=reference, note=note
    )
    recovery.status = outcome
    return _done(
        recovery,
        action=outcome,
        operator=operator,
        reference=reference if outcome == "RECOVERED" else None,
        note=note,
        entries=entries,
        flag=CHANGE,
    )


def _done(
    recovery: RailRecovery,
    *,
    action: str,
    operator: str,
    reference: str | None,
    note: str,
    entries: list[dict[str, Any]],
    flag: int,
) -> Done:
    """A recovery step's fields, event and History rows (on the recovery, and on its payout so
    both admin History pages show it)."""
    ref = recovery.rail_reference
    payout_id = str(recovery.payout_id) if recovery.payout_id else None
    what = {
        "RECORDED": f"rail recovery recorded for transfer {ref}",
        "RECOVERED": f"rail recovery of transfer {ref} closed RECOVERED "
        f"(rail reference {reference})",
        "WRITTEN_OFF": f"rail recovery of transfer {ref} closed WRITTEN_OFF",
    }[action]
    text = f"{what}: {recovery.amount_minor} {recovery.currency}; {note}"
    status = "OPEN" if action == "RECORDED" else action
    history = [History(RailRecovery, str(recovery.recovery_id), text, f"{ref} ({status})", flag)]
    if payout_id:
        history.append(History(Payout, payout_id, text, payout_id))
    fields = {
        "action": action,
        "recoveryId": str(recovery.recovery_id),
        "railReference": ref,
        "payoutId": payout_id,
        "amountMinor": int(recovery.amount_minor),
        "currency": recovery.currency,
        "status": status,
        "operator": operator,
        "reference": reference,
        "note": note,
        "classification": recovery.classification,
    }
    return Done(
        event=f"rail_recovery_{action.lower()}",
        fields={**fields, "entries": entries},
        event_fields=fields,
        history=tuple(history),
    )


def recovered_references(payout_id: uuid.UUID | str, *, alias: str | None = None) -> set[str]:
    """The rail references of this payout's transfers that have a recovery (any status)."""
    return set(
        RailRecovery.objects.using(alias or alias_for("payments"))
        .filter(payout_id=payout_id)
        .values_list("rail_reference", flat=True)
    )
