"""Guarded, audited operator resolution of a RAIL_AMBIGUOUS payout (the admin's only write).

The money-moving part is `payments.services.resolve_quarantined` (state machine + ledger); this
module decides whether the operator may call it, and records who did what:

  1. lock the account row, then the payout's reconciliation row (claim/post's lock order);
  2. check the latest reconciliation, taken after the payout entered quarantine:
     POSTED needs BOOKED_ONCE and the rail reference on the rail's statement; FAILED needs
     NOT_BOOKED. Anything else (no or stale reconciliation, BOOKED_MULTIPLE, NO_SUBMISSION,
     a reference mismatch) is refused unless the operator overrides with a reason of at least
     OVERRIDE_REASON_MIN characters (logged at WARNING);
  3. resolve through the service, write a Django LogEntry in the same transaction, and log one
     `payout_resolved` JSON event after the commit.
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.db import connections, transaction

from dlock.dbrouter import alias_for
from dlock.errors import ApiError, Code, not_found, validation_error
from dlock.logs import log_event
from payments import fenced_sql, services
from payments.models import Payout, PayoutEvent, PayoutReconciliation, QuarantinedPayout

if TYPE_CHECKING:
    import datetime as dt

    from django.contrib.auth.base_user import AbstractBaseUser

OVERRIDE_REASON_MIN = 20
# The classification each resolution needs from the reconciler.
REQUIRED_CLASSIFICATION = {"POSTED": "BOOKED_ONCE", "FAILED": "NOT_BOOKED"}


@dataclass(frozen=True)
class Resolution:
    """What an operator did to one payout (the `payout_resolved` event's fields)."""

    payout_id: str
    operator: str
    from_state: str
    to_state: str
    reference: str | None
    note: str
    override: bool
    classification: str | None
    refusal: str | None  # why the guard would have refused; set only when overridden


def guard_refusal(
    *,
    resolution: str,
    rail_reference: str | None,
    recon: PayoutReconciliation | None,
    quarantined_at: dt.datetime | None,
) -> str | None:
    """Why the reconciler's latest finding does not support this resolution (None: it does)."""
    if recon is None:
        return "the reconciler has not classified this payout yet (run manage.py reconcile)"
    if quarantined_at is not None and recon.checked_at < quarantined_at:
        return (
            f"the latest reconciliation ({recon.classification}) predates the quarantine; "
            "run manage.py reconcile again"
        )
    needed = REQUIRED_CLASSIFICATION[resolution]
    if recon.classification != needed:
        found = recon.classification
        return f"{resolution} needs classification {needed}, the reconciler says {found}"
    if resolution == "POSTED":
        references = [str(r) for r in recon.rail_references or []]
        if rail_reference not in references:
            return (
                f"rail reference {rail_reference!r} is not the one on the rail's statement "
                f"({', '.join(references) or 'none'})"
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
) -> Resolution:
    """Resolve one quarantined payout as POSTED or FAILED, only the safe way (module docstring).

    `rail_reference` defaults, for POSTED, to the single reference the reconciler found.
    Raises ApiError (VALIDATION_FAILED with details.reason) when the guard refuses, and the
    service's errors (PAYOUT_NOT_CLAIMABLE, NOT_FOUND) unchanged; nothing is written then.
    """
    note = (note or "").strip()
    rail_reference = (rail_reference or "").strip() or None
    _check_request(resolution=resolution, note=note, override=override)
    operator = user.get_username()
    alias = alias_for("payments")
    with transaction.atomic(using=alias), connections[alias].cursor() as cur:
        payout = Payout.objects.using(alias).filter(payout_id=payout_id).first()
        if payout is None:
            raise not_found("payout", str(payout_id))
        fenced_sql.lock_account(cur, account_id=payout.account_id)
        payout = Payout.objects.using(alias).select_for_update().get(payout_id=payout_id)
        recon = (
            PayoutReconciliation.objects.using(alias)
            .select_for_update()
            .filter(payout_id=payout_id)
            .first()
        )
        if payout.state != "RAIL_AMBIGUOUS":
            raise ApiError(
                Code.PAYOUT_NOT_CLAIMABLE,
                f"payout {payout_id} is {payout.state}, not RAIL_AMBIGUOUS",
                details={"payoutId": str(payout_id), "state": payout.state},
            )
        if resolution == "POSTED" and rail_reference is None and recon is not None:
            references = [str(r) for r in recon.rail_references or []]
            rail_reference = references[0] if len(references) == 1 else None
        refusal = guard_refusal(
            resolution=resolution,
            rail_reference=rail_reference,
            recon=recon,
            quarantined_at=_quarantined_at(payout_id, alias),
        )
        if refusal and not override:
            raise ApiError(
                Code.VALIDATION_FAILED,
                f"refused: {refusal}",
                details={"reason": refusal, "payoutId": str(payout_id)},
            )
        services.resolve_quarantined(
            payout_id=payout_id,
            resolution=resolution,
            operator=operator,
            note=note if not refusal else f"OVERRIDE ({refusal}): {note}",
            rail_reference=rail_reference if resolution == "POSTED" else None,
        )
        done = Resolution(
            payout_id=str(payout_id),
            operator=operator,
            from_state="RAIL_AMBIGUOUS",
            to_state=resolution,
            reference=rail_reference if resolution == "POSTED" else None,
            note=note,
            override=bool(refusal),
            classification=recon.classification if recon else None,
            refusal=refusal,
        )
        _log_entry(done, user=user, alias=alias)
        transaction.on_commit(lambda: _log(done), using=alias)
    return done


def _check_request(*, resolution: str, note: str, override: bool) -> None:
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


def _log_entry(done: Resolution, *, user: AbstractBaseUser, alias: str) -> None:
    """The Django admin history row for the resolution, in the resolving transaction."""
    LogEntry.objects.using(alias).create(
        user_id=user.pk,
        content_type=ContentType.objects.db_manager(alias).get_for_model(
            QuarantinedPayout, for_concrete_model=False
        ),
        object_id=done.payout_id,
        object_repr=done.payout_id[:200],
        action_flag=CHANGE,
        change_message=json.dumps([{"resolved": asdict(done)}]),
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


def _log(done: Resolution) -> None:
    log_event(
        "payout_resolved",
        level=logging.WARNING if done.override else logging.INFO,
        payoutId=done.payout_id,
        operator=done.operator,
        **{"from": done.from_state, "to": done.to_state},
        reference=done.reference,
        note=done.note,
        override=done.override,
        classification=done.classification,
        refusal=done.refusal,
    )
