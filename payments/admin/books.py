"""The books, read-only: accounts (with their full balance), payouts (with the evidence and
timeline on each page) and ledger entries."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.db.models.expressions import RawSQL

from payments.admin.base import (
    ObjectPages,
    ReadOnlyAdmin,
    ReadOnlyInline,
    payout_evidence,
    utc_column,
)
from payments.models import Account, LedgerEntry, Payout, PayoutEvent, PayoutReconciliation
from payments.selectors import balance_sql

if TYPE_CHECKING:
    from django.db.models import QuerySet
    from django.http import HttpRequest


@admin.register(Account)
class AccountAdmin(ReadOnlyAdmin):
    """The balance shown is the account's balance (selectors.balance_sql): a settlement
    account's row holds only part of it, the rest is in its buckets (CHANGELOG row 75)."""

    list_display = ("account_id", "kind", "currency", "balance", "fence", "updated_at_utc")
    list_filter = ("kind", "currency")
    search_fields = ("account_id",)
    fields = (
        "account_id",
        "kind",
        "currency",
        "balance",
        "row_balance",
        "fence",
        "updated_at_utc",
    )
    readonly_fields = fields
    updated_at_utc = utc_column("updated_at")

    def get_queryset(self, request: HttpRequest) -> QuerySet[Account]:
        # The table's own name: the changelist and the change form select FROM "account".
        total = RawSQL(balance_sql('"account"'), ())  # noqa: S611 - a constant, no input
        return super().get_queryset(request).annotate(balance_total=total)

    @admin.display(description="balance (minor)", ordering="balance_total")
    def balance(self, obj: Account) -> int:
        return int(obj.balance_total)  # type: ignore[attr-defined]

    @admin.display(description="on the account row (the rest: settlement buckets)")
    def row_balance(self, obj: Account) -> int:
        return obj.balance_minor


class PayoutEventInline(ReadOnlyInline):
    model = PayoutEvent
    fields = ("at_utc", "from_state", "to_state", "token", "owner_id", "note")
    readonly_fields = fields
    ordering = ("at", "id")
    at_utc = utc_column("at")


class LedgerEntryInline(ReadOnlyInline):
    model = LedgerEntry
    fk_name = "payout"
    fields = ("entry_id", "account", "direction", "amount_minor", "fence", "posted_at_utc")
    readonly_fields = fields
    posted_at_utc = utc_column("posted_at")


@admin.register(Payout)
class PayoutAdmin(ObjectPages, ReadOnlyAdmin):
    list_display = (
        "payout_id",
        "account",
        "amount_minor",
        "currency",
        "state",
        "attempt_count",
        "claim_token",
        "created_at_utc",
    )
    list_filter = ("state", "currency")
    search_fields = ("payout_id", "account__account_id", "rail_reference")
    ordering = ("-created_at",)
    inlines = (PayoutEventInline, LedgerEntryInline)
    change_form_template = "admin/payments/payout_change_form.html"
    created_at_utc = utc_column("created_at")

    def page_context(self, obj: Payout) -> dict[str, Any]:
        recon = PayoutReconciliation.objects.filter(payout_id=obj.pk).first()
        return payout_evidence(obj, recon=recon)


@admin.register(LedgerEntry)
class LedgerEntryAdmin(ReadOnlyAdmin):
    list_display = (
        "entry_id",
        "account",
        "direction",
        "amount_minor",
        "fence",
        "payout",
        "posted_at_utc",
    )
    list_filter = ("direction",)
    search_fields = ("account__account_id", "payout__payout_id")
    ordering = ("-posted_at",)
    posted_at_utc = utc_column("posted_at")
