"""Reads of the rail proxy's records for other apps' pages (the payments admin): plain values."""

from __future__ import annotations

import uuid
from typing import Any

from railproxy.models import RailSubmission


def submissions_for_payout(*, payout_id: uuid.UUID | str) -> list[RailSubmission]:
    """Every admission decision the proxy recorded for this payout, oldest first."""
    return list(RailSubmission.objects.filter(payout_id=payout_id).order_by("submitted_at"))


def submission_rows(*, payout_id: uuid.UUID | str, fmt: Any) -> list[dict[str, Any]]:
    """The attempts as the payout page shows them; `fmt` formats a timestamp."""
    return [
        {"row": s, "submitted_at": fmt(s.submitted_at), "resolved_at": fmt(s.resolved_at)}
        for s in submissions_for_payout(payout_id=payout_id)
    ]
