"""Guarded, audited operator resolution of a RAIL_AMBIGUOUS payout (the admin's only write).

The money-moving part is `payments.services.resolve_quarantined` (state machine + ledger); this
module is its guard, plugged into the operators' one pipeline (payments/operator_action.py:
locks in claim/post's order, one audit of what was done or refused):

  1. the request's own rules (`check_request`: POSTED or FAILED, an override's reason of at
     least OVERRIDE_REASON_MIN characters), before any row is read;
  2. under the account and payout row locks, the payout's reconciliation row too: the payout
     must be RAIL_AMBIGUOUS; the latest reconciliation, taken after it entered quarantine, and
     the rail recoveries recorded for its transfers (payments/recovery.py) must back the
     resolution: POSTED needs the transfers on the rail's statement that no recovery accounts
     for to be exactly one, with the given reference (BOOKED_ONCE; or BOOKED_MULTIPLE once every
     duplicate is a recovery); FAILED needs NOT_BOOKED, or every booked transfer accounted for
     by a recovery. Anything else (no or stale reconciliation, NO_SUBMISSION, a reference
     mismatch, an unrecorded transfer) is refused unless the operator overrides with a reason
     (the `payout_resolved` event is then a WARNING);
  3. resolve through the service; the pipeline writes the LogEntry on the payout in the same
     transaction and logs one `payout_resolved` JSON event after the commit.

The rail's statement is the truth (ARCHITECTURE decision 20): POSTED needs its reference on
the statement, booked for this payout with its amount, and not already a rail recovery, and no
override lifts that. The ops command reads the statement now (`statement_read`); the admin,
which has no raildb, checks the reconciler's latest finding instead.

A refusal changes nothing and is audited by the pipeline: a `payout_resolution_refused`
WARNING event, an `operator_refusal` row and a LogEntry on the payout.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import TYPE_CHECKING, Any

from dlock.dbrouter import alias_for
from dlock.errors import Code, validation_error
from payments import operator_action, services
from payments.models import Payout, PayoutEvent, PayoutReconciliation
from payments.operator_action import Action, Done, History, Refused, find_payout
from payments.recovery import StatementTransfer, recovered_references

if TYPE_CHECKING:
    import datetime as dt
    import uuid
    from collections.abc import Callable

    from django.contrib.auth.base_user import AbstractBaseUser

OVERRIDE_REASON_MIN = 20
# The classification each resolution needs from the reconciler (once recoveries are counted).
REQUIRED_CLASSIFICATION = {"POSTED": "BOOKED_ONCE", "FAILED": "NOT_BOOKED"}
BOOKED = ("BOOKED_ONCE", "BOOKED_MULTIPLE")


def unaccounted_references(
    recon: PayoutReconciliation | None, recovered: set[str] | frozenset[str] = frozenset()
) -> list[str]:
    """The payout's transfers on the rail's statement that no rail recovery accounts for."""
    if recon is None:
        return []
    return [str(r) for r in recon.rail_references or [] if str(r) not in recovered]


def allowed_resolution(
    recon: PayoutReconciliation | None, recovered: set[str] | frozenset[str] = frozenset()
) -> str | None:
    """The resolution the reconciler's finding supports (the form preselects it), or None."""
    if recon is None or recon.classification == "NO_SUBMISSION":
        return None
    left = unaccounted_references(recon, recovered)
    if recon.classification == "NOT_BOOKED" or (recon.classification in BOOKED and not left):
        return "FAILED"
    return "POSTED" if len(left) == 1 else None


def guard_refusal(
    *,
    resolution: str,
    rail_reference: str | None,
    recon: PayoutReconciliation | None,
    quarantined_at: dt.datetime | None,
    recovered: set[str] | frozenset[str] = frozenset(),
) -> str | None:
    """Why the reconciler's latest finding does not support this resolution (None: it does)."""
    if recon is None:
        return "the reconciler has not classified this payout yet (run manage.py reconcile)"
    if quarantined_at is not None and recon.checked_at < quarantined_at:
        return (
            f"the latest reconciliation ({recon.classification}) predates the quarantine; "
            "run manage.py reconcile again"
        )
    found = recon.classification
    left = unaccounted_references(recon, recovered)
    if resolution == "FAILED":
        if found == "NOT_BOOKED" or (found in BOOKED and not left):
            return None
        if found in BOOKED:
            return (
                f"FAILED needs classification NOT_BOOKED, the reconciler says {found}: the rail "
                f"booked {', '.join(left)}; record each as a rail recovery first "
                "(manage.py record_rail_recovery) or resolve POSTED"
            )
        return f"FAILED needs classification NOT_BOOKED, the reconciler says {found}"
    if found not in BOOKED:
        return f"POSTED needs classification BOOKED_ONCE, the reconciler says {found}"
    if len(left) != 1:
        return (
            f"POSTED needs exactly one booked transfer no rail recovery accounts for; the "
            f"statement has {len(left)} ({', '.join(left) or 'none'}): record the duplicates "
            "as rail recoveries first"
        )
    if rail_reference not in left:
        return (
            f"rail reference {rail_reference!r} is not the one on the rail's statement "
            f"({', '.join(left)})"
        )
    return None


def statement_refusal(
    *,
    payout: Payout,
    rail_reference: str | None,
    recon: PayoutReconciliation | None,
    recovered: set[str] | frozenset[str],
    statement: StatementTransfer | None | bool,  # False: the caller did not read it
) -> str | None:
    """Why POSTED with this reference would book money the rail's statement does not show
    leaving for this payout (None: it does). No override lifts it."""
    if rail_reference is None:
        return "POSTED needs the rail statement's reference of the transfer (--reference)"
    if rail_reference in recovered:
        return f"transfer {rail_reference} is a rail recovery already; it cannot also post"
    if statement is False:  # the admin: the reconciler's latest reading of the statement
        if recon is None or rail_reference not in (recon.rail_references or []):
            return (
                f"rail reference {rail_reference!r} is not on the rail's statement for this "
                "payout as the reconciler last read it (run manage.py reconcile)"
            )
        return None
    if not isinstance(statement, StatementTransfer):
        return f"rail reference {rail_reference!r} is not on the rail's statement"
    payout_id = str(payout.payout_id)
    if statement.client_ref != payout_id:
        return (
            f"rail reference {rail_reference!r} on the rail's statement is a transfer for "
            f"{statement.client_ref}, not for this payout"
        )
    if (statement.amount_minor, statement.currency) != (payout.amount_minor, payout.currency):
        return (
            f"rail reference {rail_reference!r} on the rail's statement is "
            f"{statement.amount_minor} {statement.currency}, the payout "
            f"{payout.amount_minor} {payout.currency}"
        )
    return None


def resolve_payout(
    *,
    payout_id: uuid.UUID,
    resolution: str,
    user: AbstractBaseUser,
    note: str,
    rail_reference: str | None = None,
    override: bool = False,
    read_statement: Callable[[str], StatementTransfer | None] | None = None,
) -> Done:
    """Resolve one quarantined payout as POSTED or FAILED, only the safe way (module docstring).

    `rail_reference` defaults, for POSTED, to the single reference the reconciler found. A
    caller with raildb passes `read_statement` (reference → the statement's row, or None when
    the statement lacks it): POSTED is then checked against the statement read now.
    Raises ApiError VALIDATION_FAILED for a bad input and NOT_FOUND for a payout that exists
    nowhere (neither recorded), and Refused (recorded: payments.operator_action) when a guard
    refuses or the payout is not RAIL_AMBIGUOUS (code PAYOUT_NOT_CLAIMABLE); nothing is
    written then but the refusal's audit.
    """
    note = (note or "").strip()
    rail_reference = (rail_reference or "").strip() or None
    check_request(resolution=resolution, note=note, override=override)

    return operator_action.run(
        Action(
            name=f"resolve as {resolution}",
            refused_event="payout_resolution_refused",
            target=partial(find_payout, payout_id),
            apply=partial(
                _apply,
                resolution=resolution,
                note=note,
                rail_reference=rail_reference,
                override=override,
                read_statement=read_statement,
            ),
            note=note,
            object_model=Payout,
            object_id=str(payout_id),
            ids={"payoutId": str(payout_id)},
            extra={"to": resolution},
        ),
        user=user,
    )


def _apply(
    cursor: Any,
    payout: Payout | None,
    operator: str,
    *,
    resolution: str,
    note: str,
    rail_reference: str | None,
    override: bool,
    read_statement: Callable[[str], StatementTransfer | None] | None,
) -> Done:
    """The guards and the resolution, under the account and payout row locks."""
    assert payout is not None  # find_payout found it
    alias = alias_for("payments")
    payout_id = payout.payout_id
    recon = (
        PayoutReconciliation.objects.using(alias)
        .select_for_update()
        .filter(payout_id=payout_id)
        .first()
    )
    if payout.state != "RAIL_AMBIGUOUS":
        raise Refused(
            f"payout {payout_id} is {payout.state}, not RAIL_AMBIGUOUS",
            str(payout_id),
            code=Code.PAYOUT_NOT_CLAIMABLE,
            details={"state": payout.state},
        )
    recovered = recovered_references(payout_id, alias=alias)
    if resolution == "POSTED" and rail_reference is None:
        left = unaccounted_references(recon, recovered)
        rail_reference = left[0] if len(left) == 1 else None
    refusal = guard_refusal(
        resolution=resolution,
        rail_reference=rail_reference,
        recon=recon,
        quarantined_at=_quarantined_at(payout_id, alias),
        recovered=recovered,
    )
    if refusal and not override:
        raise Refused(refusal, str(payout_id))
    truth = (
        statement_refusal(
            payout=payout,
            rail_reference=rail_reference,
            recon=recon,
            recovered=recovered,
            statement=_read(read_statement, rail_reference),
        )
        if resolution == "POSTED"
        else None
    )
    if truth:  # the statement is the truth: no override posts money that never left
        raise Refused(truth, str(payout_id))
    reference = rail_reference if resolution == "POSTED" else None
    services.resolve_quarantined(
        payout_id=payout_id,
        resolution=resolution,
        operator=operator,
        note=note if not refusal else f"OVERRIDE ({refusal}): {note}",
        rail_reference=reference,
    )
    return _resolved(
        payout_id=str(payout_id),
        resolution=resolution,
        operator=operator,
        reference=reference,
        note=note,
        classification=recon.classification if recon else None,
        refusal=refusal,
    )


def _resolved(
    *,
    payout_id: str,
    resolution: str,
    operator: str,
    reference: str | None,
    note: str,
    classification: str | None,
    refusal: str | None,  # why the guard would have refused; set only when overridden
) -> Done:
    """A resolution's fields, its `payout_resolved` event and its History row on the payout."""
    detail = f"reference {reference}, " if reference else ""
    history = (
        f"resolved RAIL_AMBIGUOUS → {resolution} ({detail}reconciler "
        f"{classification or 'none'}){' OVERRIDE: ' + refusal if refusal else ''}: {note}"
    )
    common = {
        "payoutId": payout_id,
        "operator": operator,
        "reference": reference,
        "note": note,
        "override": bool(refusal),
        "classification": classification,
        "refusal": refusal,
    }
    return Done(
        event="payout_resolved",
        level=logging.WARNING if refusal else logging.INFO,
        fields={**common, "fromState": "RAIL_AMBIGUOUS", "toState": resolution},
        event_fields={**common, "from": "RAIL_AMBIGUOUS", "to": resolution},
        history=(History(Payout, payout_id, history),),
    )


def _read(
    read_statement: Callable[[str], StatementTransfer | None] | None, rail_reference: str | None
) -> StatementTransfer | None | bool:
    """The statement's row for the reference; False when the caller cannot read raildb."""
    if read_statement is None or not rail_reference:
        return False
    return read_statement(rail_reference)


def check_request(*, resolution: str, note: str, override: bool) -> None:
    """The form's own rules, before any row is read: a known resolution, a reasoned override."""
    if resolution not in REQUIRED_CLASSIFICATION:
        raise validation_error(
            "resolution must be POSTED or FAILED",
            [{"field": "resolution", "message": "POSTED or FAILED"}],
        )
    if override and len(note) < OVERRIDE_REASON_MIN:
        raise validation_error(
            f"an override needs a reason of at least {OVERRIDE_REASON_MIN} characters",
            [{"field": "note", "message": f">= {OVERRIDE_REASON_MIN} characters"}],
        )


def _quarantined_at(payout_id: uuid.UUID, alias: str) -> dt.datetime | None:
    """When the payout last entered RAIL_AMBIGUOUS (its payout_event row), or None."""
    event = (
        PayoutEvent.objects.using(alias)
        .filter(payout_id=payout_id, to_state="RAIL_AMBIGUOUS")
        .order_by("-at", "-id")
        .first()
    )
    return event.at if event else None
