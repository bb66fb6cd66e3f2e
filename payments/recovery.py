"""Rail recoveries: guarded, audited operator booking of rail transfers no POSTED payout
accounts for (ARCHITECTURE decision 20). The admin and the ops commands both call these.

The rail's statement is the truth about money that left. A transfer beyond the one a POSTED
payout accounts for (a duplicate ack), or the booked transfer of a payout resolved FAILED, is
recorded from the reconciler's evidence (its `payout_reconciliation` finding lists the
transfer with its amount) and booked:

  record     DEBIT recoverable:rail:<ccy>   CREDIT settlement:<ccy>      (money left)
  RECOVERED  DEBIT settlement:<ccy>         CREDIT recoverable:rail:<ccy> (money came back)
  WRITTEN_OFF DEBIT loss:rail:<ccy>         CREDIT recoverable:rail:<ccy>

Each step is one paydb transaction: the recovery row, both ledger legs with both balances, a
`rail_recovery_event` row and Django LogEntry rows (on the recovery and on its payout, so both
admin History pages show it); a JSON log event after the commit. A refusal changes nothing,
and is itself audited: a `rail_recovery_refused` WARNING event and a LogEntry. Nothing here is
automatic: only an operator calls it; the reconciler writes no ledger rows.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.contrib.admin.models import ADDITION, CHANGE
from django.db import IntegrityError, transaction
from django.db.models.functions import Now

from dlock.dbrouter import alias_for
from dlock.timefmt import rfc3339_ms
from payments.fenced_sql import account as account_sql
from payments.models import (
    AccountKind,
    Payout,
    PayoutReconciliation,
    RailRecovery,
    RailRecoveryEvent,
)
from payments.recovery_trail import (
    RecoveryStep,
    Refused,
    book_legs,
    cursor_on,
    log_done,
    log_entries,
    record_refusal,
    refused_error,
)
from payments.services import settlement_account_id

if TYPE_CHECKING:
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


def record_recovery(
    *,
    rail_reference: str,
    reason: str,
    user: AbstractBaseUser,
    statement_read: bool = False,
    statement: StatementTransfer | None = None,
) -> RecoveryStep:
    """Record one rail transfer as a recovery and book it (module docstring).

    Refused (ApiError VALIDATION_FAILED, details.reason; nothing written but the refusal's
    audit) when the reason is short, the transfer already has a recovery, the reconciler has
    not seen it on the statement, the caller read the statement itself (`statement_read`, the
    ops commands) and `statement` is None or disagrees, the payout is still in flight, or it
    is the very transfer a POSTED payout accounts for.
    """
    rail_reference = (rail_reference or "").strip()
    reason = (reason or "").strip()
    operator = user.get_username()
    alias = alias_for("payments")
    try:
        with transaction.atomic(using=alias):
            step = _record(
                rail_reference, reason, operator, statement if statement_read else False, alias
            )
            log_entries(step, user=user, alias=alias, flag=ADDITION)
            log_done(step, alias)
        return step
    except Refused as refused:
        record_refusal(
            "record", rail_reference, refused, user=user, alias=alias, note=reason, extra={}
        )
        raise refused_error(rail_reference, refused) from None


def _recordable(
    rail_reference: str,
    reason: str,
    statement: StatementTransfer | None | bool,
    alias: str,
) -> tuple[PayoutReconciliation, str, int, str]:
    """The guards before any lock: reference and reason given, no recovery yet, on the
    statement, seen by the reconciler with the statement's payout and amount. Returns the
    finding, its payout id, amount and currency."""
    if not rail_reference:
        raise Refused("a rail reference (--transfer) is required")
    if len(reason) < REASON_MIN:
        raise Refused(f"a reason of at least {REASON_MIN} characters is required")
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
    return recon, payout_id, amount, currency


def _record(
    rail_reference: str,
    reason: str,
    operator: str,
    statement: StatementTransfer | None | bool,  # False: not read by the caller
    alias: str,
) -> RecoveryStep:
    recon, payout_id, amount, currency = _recordable(rail_reference, reason, statement, alias)
    payout = Payout.objects.using(alias).get(payout_id=recon.payout_id)
    with cursor_on(alias) as cur:
        # The resolve/post lock order: the account row, then the payout row.
        account_sql.lock_account(cur, account_id=payout.account_id)
    payout = Payout.objects.using(alias).select_for_update().get(payout_id=recon.payout_id)
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
    entries = book_legs(
        alias,
        recovery=recovery,
        debit=(recoverable_account_id(currency), AccountKind.RECOVERABLE),
        credit=(settlement_account_id(currency), AccountKind.SETTLEMENT),
    )
    RailRecoveryEvent.objects.using(alias).create(
        recovery=recovery, action="RECORDED", operator=operator, note=reason
    )
    return RecoveryStep(
        action="RECORDED",
        recovery_id=str(recovery.recovery_id),
        rail_reference=rail_reference,
        payout_id=payout_id,
        amount_minor=amount,
        currency=currency,
        status="OPEN",
        operator=operator,
        reference=None,
        note=reason,
        classification=recon.classification,
        entries=entries,
    )


def close_recovery(
    *,
    rail_reference: str,
    outcome: str,
    user: AbstractBaseUser,
    reference: str | None = None,
    reason: str | None = None,
) -> RecoveryStep:
    """Close an OPEN recovery as RECOVERED (with the rail's reference of the money that came
    back) or WRITTEN_OFF (with a reason, and no reference). Refused, and audited, when there
    is no such recovery, it is closed already, or the reference / reason is missing (or a
    reference is given to WRITTEN_OFF)."""
    rail_reference = (rail_reference or "").strip()
    reference = (reference or "").strip() or None
    reason = (reason or "").strip()
    operator = user.get_username()
    alias = alias_for("payments")
    try:
        with transaction.atomic(using=alias):
            step = _close(rail_reference, outcome, reference, reason, operator, alias)
            log_entries(step, user=user, alias=alias, flag=CHANGE)
            log_done(step, alias)
        return step
    except Refused as refused:
        record_refusal(
            "close",
            rail_reference,
            refused,
            user=user,
            alias=alias,
            note=reason,
            extra={"outcome": outcome, "reference": reference},
        )
        raise refused_error(rail_reference, refused) from None


def _close(
    rail_reference: str,
    outcome: str,
    reference: str | None,
    reason: str,
    operator: str,
    alias: str,
) -> RecoveryStep:
    if outcome not in CLOSE_OUTCOMES:
        raise Refused("a recovery closes as RECOVERED or WRITTEN_OFF")
    if outcome == "WRITTEN_OFF" and reference:
        raise Refused(
            f"WRITTEN_OFF takes no reference ({reference!r}): money that came back with a rail "
            "reference closes RECOVERED; put a ticket number in the reason"
        )
    recovery = (
        RailRecovery.objects.using(alias)
        .select_for_update()
        .filter(rail_reference=rail_reference)
        .first()
    )
    if recovery is None:
        raise Refused(f"no rail recovery for transfer {rail_reference!r}")
    payout_id = str(recovery.payout_id) if recovery.payout_id else None
    if recovery.status != "OPEN":
        raise Refused(
            f"the recovery of transfer {rail_reference} is already {recovery.status} "
            f"(closed by {recovery.closed_by} at {rfc3339_ms(recovery.closed_at)})",
            payout_id,
        )
    if outcome == "RECOVERED" and not reference:
        raise Refused("RECOVERED needs the rail's reference of the money that came back", payout_id)
    if outcome == "WRITTEN_OFF" and len(reason) < REASON_MIN:
        raise Refused(f"WRITTEN_OFF needs a reason of at least {REASON_MIN} characters", payout_id)
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
    entries = book_legs(
        alias,
        recovery=recovery,
        debit=debit,
        credit=(recoverable_account_id(currency), AccountKind.RECOVERABLE),
    )
    note = reason or f"recovered with rail reference {reference}"
    RailRecoveryEvent.objects.using(alias).create(
        recovery=recovery, action=outcome, operator=operator, reference=reference, note=note
    )
    return RecoveryStep(
        action=outcome,
        recovery_id=str(recovery.recovery_id),
        rail_reference=rail_reference,
        payout_id=payout_id,
        amount_minor=int(recovery.amount_minor),
        currency=currency,
        status=outcome,
        operator=operator,
        reference=reference if outcome == "RECOVERED" else None,
        note=note,
        classification=recovery.classification,
        entries=entries,
    )


def recovered_references(payout_id: uuid.UUID | str, *, alias: str | None = None) -> set[str]:
    """The rail references of this payout's transfers that have a recovery (any status)."""
    return set(
        RailRecovery.objects.using(alias or alias_for("payments"))
        .filter(payout_id=payout_id)
        .values_list("rail_reference", flat=True)
    )
