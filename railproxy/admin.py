"""The rail proxy's admin pages (payments role, where the admin runs): its submission records,
read-only, and their section on a payout's page (registered with payments' evidence hook, so
the dependency points from railproxy to payments, never back)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import admin

from payments.admin.base import ReadOnlyAdmin, register_evidence, utc, utc_column
from railproxy.models import RailSubmission
from railproxy.selectors import submission_rows

if TYPE_CHECKING:
    from payments.models import Payout


@register_evidence
def submission_attempts(payout: Payout) -> dict[str, Any]:
    """Every rail submission attempt for the payout (presented token, outcome, times)."""
    return {"submissions": submission_rows(payout_id=payout.payout_id, fmt=utc)}


@admin.register(RailSubmission)
class RailSubmissionAdmin(ReadOnlyAdmin):
    list_display = (
        "submission_id",
        "payout_id",
        "presented_token",
        "outcome",
        "detail",
        "rail_reference",
        "submitted_at_utc",
        "resolved_at_utc",
    )
    list_filter = ("outcome",)
    search_fields = ("payout_id", "rail_reference", "submission_id")
    ordering = ("-submitted_at",)

    submitted_at_utc = utc_column("submitted_at")
    resolved_at_utc = utc_column("resolved_at")
