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
order), run and audited by the operators' one pipeline (payments/operator_action.py); a
refusal writes nothing but its audit.
"""

from __future__ import annotations

import uuid
from functools import partial
from typing import TYPE_CHECKING, Any

from django.contrib.admin.models import ADDITION

from dlock.dbrouter import alias_for
from dlock.errors import validation_error
from payments import operator_action
from payments.fenced_sql.payout import transition_payout
from payments.models import (
    AccountKind,
    Payout,
    PayoutEvent,
    PayoutReconciliation,
    PayoutReversal,
)
from payments.operator_action import Action, Done, History, Refused, book, find_payout
from payments.services import settlement_account_id

if TYPE_CHECKING:
    from collections.abc import Callable

    from django.contrib.auth.base_user import AbstractBaseUser

    from payments.recovery import StatementTransfer

REASON_MIN = 8


def check_reason(reason: str) -> None:
    """The reversal's own rule, before any row is read (VALIDATION_FAILED, not audited)."""
    if len(reason) < REASON_MIN:
        raise validation_error(
            f"a reason of at least {REASON_MIN} characters is required",
            [{"field": "reason", "message": f">= {REASON_MIN} characters"}],
        )


def reverse_payout(
    *,
    payout_id: uuid.UUID,
    reason: str,
    user: AbstractBaseUser,
    read_statement: Callable[[str], StatementTransfer | None],
) -> Done:
    """Reverse one POSTED payout the statement contradicts (module docstring), through the
    operators' pipeline (payments/operator_action.py). A short reason is VALIDATION_FAILED and
    a payout that exists nowhere NOT_FOUND, neither audited; otherwise Refused (recorded)."""
    reason = (reason or "").strip()
    check_reason(reason)
    return operator_action.run(
        Action(
            name="reverse POSTED",
            refused_event="payout_reversal_refused",
            target=partial(find_payout, payout_id),
            apply=partial(_reverse, reason=reason, read_statement=read_statement),
            note=reason,
            object_model=Payout,
            object_id=str(payout_id),
            ids={"payoutId": str(payout_id)},
        ),
        user=user,
    )


def _reverse(
    cursor: Any,
    payout: Payout | None,
    operator: str,
    *,
    reason: str,
    read_statement: Callable[[str], StatementTransfer | None],
) -> Done:
    """Under the account and payout row locks: the guards, the reversal row, its two legs and
    the move POSTED → FAILED."""
    assert payout is not None  # find_payout found it
    alias = alias_for("payments")
    payout_id = payout.payout_id
    if payout.state != "POSTED":
        raise Refused(
            f"payout {payout_id} is {payout.state}; only a POSTED payout is reversed",
            str(payout_id),
        )
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
    amount, currency = int(payout.amount_minor), payout.currency
    entries = book(
        alias,
        owner={"reversal": reversal},
        amount_minor=amount,
        currency=currency,
        debit=(settlement_account_id(currency), AccountKind.SETTLEMENT),
        credit=(payout.account_id, AccountKind.CUSTOMER),
    )
    moved = transition_payout(
        cursor,
        payout_id=payout_id,
        from_states=("POSTED",),
        to_state="FAILED",
        token=None,
        owner_id=f"operator:{operator}"[:64],
        note=f"REVERSED ({reference} not on the rail's statement): {reason}",
    )
    if not moved:  # pragma: no cover - the payout row is locked above
        raise Refused(f"payout {payout_id} is no longer POSTED", str(payout_id))
    return _reversed(payout, reversal, operator=operator, entries=entries)


def _reversed(
    payout: Payout, reversal: PayoutReversal, *, operator: str, entries: list[dict[str, Any]]
) -> Done:
    """A reversal's fields, its `payout_reversed` event and its History rows (on the payout and
    on the reversal)."""
    payout_id, reference = str(payout.payout_id), reversal.rail_reference
    amount, currency = int(reversal.amount_minor), reversal.currency
    fields = {
        "action": "REVERSED",
        "reversalId": str(reversal.reversal_id),
        "payoutId": payout_id,
        "accountId": payout.account_id,
        "railReference": reference,
        "amountMinor": amount,
        "currency": currency,
        "fromState": "POSTED",
        "toState": "FAILED",
        "operator": operator,
        "reason": reversal.reason,
        "classification": reversal.classification,
        "statementReferences": reversal.statement_references,
    }
    return Done(
        event="payout_reversed",
        fields={**fields, "entries": entries},
        event_fields=fields,
        history=(
            History(
                Payout,
                payout_id,
                f"reversed POSTED → FAILED (reference {reference} not on the rail's statement; "
                f"reconciler {reversal.classification}): {amount} {currency} back to "
                f"{payout.account_id}; {reversal.reason}",
            ),
            History(
                PayoutReversal,
                str(reversal.reversal_id),
                f"reversal of payout {payout_id}: {reversal.reason}",
                f"reversal of {payout_id}",
                ADDITION,
            ),
        ),
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
        raise Refused(
            "the reconciler has no finding for this payout since it was POSTED "
            "(run manage.py reconcile; a POSTED payout it finds contradicted gets one)"
        )
    on_statement = [str(r) for r in recon.rail_references or []]
    if reference in on_statement:
        raise Refused(
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
        raise Refused(
            f"the rail's statement, read now, has reference {reference} for this payout "
            "(the reconciler's finding is older): run manage.py reconcile"
        )
    return recon, on_statement
