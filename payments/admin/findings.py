"""The reconciler's findings: its latest classification per payout, where the books and the
rail's statement disagree, and which transfers still need a rail recovery."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import admin

from payments.admin.base import ObjectPages, ReadOnlyAdmin, payout_evidence, utc_column
from payments.models import PayoutReconciliation
from payments.recovery import recovered_references

if TYPE_CHECKING:
    pass


@admin.register(PayoutReconciliation)
class ReconciliationAdmin(ObjectPages, ReadOnlyAdmin):
    """The reconciler's latest finding per payout it classified: where the books and the
    rail's statement disagree, and which transfers still need a rail recovery."""

    list_display = (
        "payout",
        "state",
        "classification",
        "rail_transfer_count",
        "references",
        "unaccounted",
        "checked_at_utc",
    )
    list_filter = ("classification", "payout__state")
    search_fields = ("payout__payout_id",)
    list_select_related = ("payout",)
    ordering = ("-checked_at",)
    change_form_template = "admin/payments/reconciliation_change_form.html"

    @admin.display(description="state now", ordering="payout__state")
    def state(self, obj: PayoutReconciliation) -> str:
        return obj.payout.state

    @admin.display(description="rail references")
    def references(self, obj: PayoutReconciliation) -> str:
        return ", ".join(map(str, obj.rail_references or []))

    @admin.display(description="needing a recovery")
    def unaccounted(self, obj: PayoutReconciliation) -> str:
        payout = obj.payout
        recovered = recovered_references(payout.pk)
        left = [
            str(r)
            for r in obj.rail_references or []
            if str(r) not in recovered
            and not (payout.state == "POSTED" and payout.rail_reference == str(r))
        ]
        if payout.state == "POSTED" and payout.rail_reference is None:
            left = left[1:]
        return ", ".join(left) if payout.state in ("POSTED", "FAILED", "ABANDONED") else ""

    checked_at_utc = utc_column("checked_at")

    def page_context(self, obj: PayoutReconciliation) -> dict[str, Any]:
        return payout_evidence(obj.payout, recon=obj)
