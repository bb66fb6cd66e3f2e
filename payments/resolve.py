"""Guarded, audited operator resolution of a RAIL_AMBIGUOUS payout (the admin's only write).

The money-moving part is `payments.services.resolve_quarantined` (state machine + ledger); this
module decides whether the operator may call it, and records who did what:

  1. lock the account row, then the payout's reconciliation row (claim/post's lock order);
  2. check the latest reconciliation, taken after the payout entered quarantine, and the rail
     recoveries recorded for the payout's transfers (payments/recovery.py): POSTED needs the
     transfers on the rail's statement that no recovery accounts for to be exactly one, with
     the given reference (BOOKED_ONCE; or BOOKED_MULTIPLE once every duplicate is a recovery);
     FAILED needs NOT_BOOKED, or every booked transfer accounted for by a recovery. Anything
     else (no or stale reconciliation, NO_SUBMISSION, a reference mismatch, an unrecorded
     transfer) is refused unless the operator overrides with a reason of at least
     OVERRIDE_REASON_MIN characters (logged at WARNING);
  3. resolve through the service, write a Django LogEntry on the payout in the same
     transaction, and log one `payout_resolved` JSON event after the commit.

The rail's statement is the truth (ARCHITECTURE decision 20): POSTED needs its reference on
the statement, booked for this payout with its amount, and not already a rail recovery, and no
override lifts that. The ops command reads the statement now (`statement_read`); the admin,
which has no raildb, checks the reconciler's latest finding instead.

A refusal changes nothing and is audited too: a `payout_resolution_refused` WARNING event
(operator, reason) and a LogEntry on the payout.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.db import connections, transaction

from dlock.dbrouter import alias_for
from dlock.errors import ApiError, Code, not_found, validation_error
from payments import audit, services
from payments.fenced_sql import account as account_sql
from payments.models import Payout, PayoutEvent, PayoutReconciliation
from payments.recovery import StatementTransfer, recovered_references

if TYPE_CHECKING:
    import datetime as dt
    from collections.abc import Callable

    from django.contrib.auth.base_user import AbstractBaseUser

OVERRIDE_REASON_MIN = 20
# The classification each resolution needs from the reconciler (once recoveries are counted).
REQUIRED_CLASSIFICATION = {"POSTED": "BOOKED_ONCE", "FAILED": "NOT_BOOKED"}
BOOKED = ("BOOKED_ONCE", "BOOKED_MULTIPLE")


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

    def as_dict(self) -> dict[str, object]:
        """camelCase, as the API and the other commands' --json."""
        return {
            "ok": True,
            "payoutId": self.payout_id,
            "operator": self.operator,
            "fromState": self.from_state,
            "toState": self.to_state,
            "reference": self.reference,
            "note": self.note,
            "override": self.override,
            "classification": self.classification,
            "refusal": self.refusal,
        }


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
) -> Resolution:
    """Resolve one quarantined payout as POSTED or FAILED, only the safe way (module docstring).

    `rail_reference` defaults, for POSTED, to the single reference the reconciler found. A
    caller with raildb passes `read_statement` (reference → the statement's row, or None when
    the statement lacks it): POSTED is then checked against the statement read now.
    Raises ApiError (VALIDATION_FAILED with details.reason) when the guard refuses, and the
    service's errors (PAYOUT_NOT_CLAIMABLE, NOT_FOUND) unchanged; nothing is written then.
    """
    note = (note or "").strip()
    rail_reference = (rail_reference or "").strip() or None
    operator = user.get_username()
    alias = alias_for("payments")
    try:
        _check_request(resolution=resolution, note=note, override=override)
        with transaction.atomic(using=alias), connections[alias].cursor() as cur:
            payout, recon = _lock_quarantined(cur, payout_id=payout_id, alias=alias)
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
                raise _refused_error(refusal, payout_id)
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
                raise _refused_error(truth, payout_id)
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
            _audit_done(done, user=user, alias=alias)
    except ApiError as exc:
        _refused(exc, payout_id=payout_id, resolution=resolution, user=user, note=note)
        raise
    return done


def _refused_error(reason: str, payout_id: uuid.UUID) -> ApiError:
    return ApiError(
        Code.VALIDATION_FAILED,
        f"refused: {reason}",
        details={"reason": reason, "payoutId": str(payout_id)},
    )


def _lock_quarantined(
    cur: Any, *, payout_id: uuid.UUID, alias: str
) -> tuple[Payout, PayoutReconciliation | None]:
    """The payout and its finding, locked in the resolve/post order (the account row, then the
    payout row); refused unless the payout is RAIL_AMBIGUOUS."""
    payout = Payout.objects.using(alias).filter(payout_id=payout_id).first()
    if payout is None:
        raise not_found("payout", str(payout_id))
    account_sql.lock_account(cur, account_id=payout.account_id)
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
    return payout, recon


def _read(
    read_statement: Callable[[str], StatementTransfer | None] | None, rail_reference: str | None
) -> StatementTransfer | None | bool:
    """The statement's row for the reference; False when the caller cannot read raildb."""
    if read_statement is None or not rail_reference:
        return False
    return read_statement(rail_reference)


def _audit_done(done: Resolution, *, user: AbstractBaseUser, alias: str) -> None:
    _log_entry(done, user=user, alias=alias)
    audit.done(
        "payout_resolved",
        level=logging.WARNING if done.override else logging.INFO,
        alias=alias,
        payoutId=done.payout_id,
        operator=done.operator,
        **{"from": done.from_state, "to": done.to_state},
        reference=done.reference,
        note=done.note,
        override=done.override,
        classification=done.classification,
        refusal=done.refusal,
    )


def _refused(
    exc: ApiError, *, payout_id: uuid.UUID, resolution: str, user: AbstractBaseUser, note: str
) -> None:
    """Audit a refusal (nothing else was written): payments.audit.refused, with a LogEntry on
    the payout when it exists."""
    reason = str((exc.details or {}).get("reason") or exc.message)
    exists = Payout.objects.using(alias_for("payments")).filter(payout_id=payout_id).exists()
    audit.refused(
        "payout_resolution_refused",
        operator=user.get_username(),
        user=user,
        action=f"resolve as {resolution}",
        reason=reason,
        model=Payout if exists else None,
        object_type="payout",
        object_id=str(payout_id),
        note=note,
        payoutId=str(payout_id),
        to=resolution,
        code=exc.code.value if hasattr(exc.code, "value") else str(exc.code),
    )


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
    """The admin history row for the resolution, on the payout itself (its History page shows
    it), in the resolving transaction; plain text, shown as written."""
    detail = f"reference {done.reference}, " if done.reference else ""
    text = (
        f"resolved {done.from_state} → {done.to_state} ({detail}reconciler "
        f"{done.classification or 'none'}){' OVERRIDE: ' + done.refusal if done.refusal else ''}"
        f": {done.note}"
    )
    audit.log_entry(user=user, model=Payout, object_id=done.payout_id, text=text, alias=alias)


def _quarantined_at(payout_id: uuid.UUID, alias: str) -> dt.datetime | None:
    """When the payout last entered RAIL_AMBIGUOUS (its payout_event row), or None."""
    event = (
        PayoutEvent.objects.using(alias)
        .filter(payout_id=payout_id, to_state="RAIL_AMBIGUOUS")
        .order_by("-at", "-id")
        .first()
    )
    return event.at if event else None
