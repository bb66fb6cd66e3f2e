"""What operators did and were refused, read-only: payout reversals (payments/reversal.py) and
refused operator steps (payments/audit.py). Staff with the view permission see them; nobody
adds, changes or deletes a row here."""

from __future__ import annotations

from django.contrib import admin

from payments.admin.base import ReadOnlyAdmin, utc_column
from payments.models import OperatorRefusal, PayoutReversal


@admin.register(PayoutReversal)
class PayoutReversalAdmin(ReadOnlyAdmin):
    list_display = (
        "payout",
        "rail_reference",
        "amount_minor",
        "currency",
        "classification",
        "reversed_by",
        "reversed_at_utc",
    )
    list_filter = ("currency", "classification")
    search_fields = ("payout__payout_id", "rail_reference", "reversed_by")
    ordering = ("-reversed_at",)
    fields = (
        "reversal_id",
        "payout",
        "rail_reference",
        "amount_minor",
        "currency",
        "classification",
        "statement_references",
        "reason",
        "reversed_by",
        "reversed_at_utc",
    )
    readonly_fields = fields
    reversed_at_utc = utc_column("reversed_at")


@admin.register(OperatorRefusal)
class OperatorRefusalAdmin(ReadOnlyAdmin):
    list_display = (
        "at_utc",
        "operator",
        "known_user",
        "action",
        "object_type",
        "object_id",
        "reason",
    )
    list_filter = ("action", "object_type", "known_user")
    search_fields = ("operator", "object_id", "reason")
    ordering = ("-at", "-id")
    fields = (*list_display, "note")
    readonly_fields = fields
    at_utc = utc_column("at")
