"""Reads of the rail's statement for other roles' tools (the ops commands): plain dicts."""

from __future__ import annotations

from typing import Any

from dlock.dbrouter import alias_for
from dlock.timefmt import rfc3339_ms
from railstub.models import RailTransfer


def statement_transfer(*, rail_reference: str) -> dict[str, Any] | None:
    """One booked transfer by the rail's reference, or None when the statement lacks it."""
    rows = RailTransfer.objects.using(alias_for("railstub"))
    row = rows.filter(rail_reference=rail_reference).first()
    if row is None:
        return None
    return {
        "railReference": row.rail_reference,
        "clientRef": row.client_ref,
        "amountMinor": int(row.amount_minor),
        "currency": row.currency,
        "acceptedAt": rfc3339_ms(row.accepted_at),
    }
