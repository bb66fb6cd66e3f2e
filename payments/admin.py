"""Staff admin: read-only books, the payout timeline, and the RAIL_AMBIGUOUS quarantine.

Nothing here writes a row directly: the only write is the quarantine's resolve action, which
goes through `payments.services.resolve_quarantined` (state machine + ledger in one transaction).
"""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.template.response import TemplateResponse

from dlock.errors import ApiError
from payments import services
from payments.models import (
    Account,
    LedgerEntry,
    Payout,
    PayoutEvent,
    PayoutReconciliation,
    QuarantinedPayout,
)


class ReadOnlyAdmin(admin.ModelAdmin):
    """View-only: money and history change through the fenced services, never a form."""

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(Account)
class AccountAdmin(ReadOnlyAdmin):
    list_display = ("account_id", "kind", "currency", "balance_minor", "fence", "updated_at")
    list_filter = ("kind", "currency")
    search_fields = ("account_id",)


class ReadOnlyInline(admin.TabularInline):
    """A payout's history rows, shown and never edited, added or deleted."""

    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


class PayoutEventInline(ReadOnlyInline):
    model = PayoutEvent
    fields = ("at", "from_state", "to_state", "token", "owner_id", "note")
    readonly_fields = fields
    ordering = ("at", "id")


class LedgerEntryInline(ReadOnlyInline):
    model = LedgerEntry
    fk_name = "payout"
    fields = ("entry_id", "account", "direction", "amount_minor", "fence", "posted_at")
    readonly_fields = fields


@admin.register(Payout)
class PayoutAdmin(ReadOnlyAdmin):
    list_display = (
        "payout_id",
        "account",
        "amount_minor",
        "currency",
        "state",
        "attempt_count",
        "claim_token",
        "created_at",
    )
    list_filter = ("state", "currency")
    search_fields = ("payout_id", "account__account_id", "rail_reference")
    ordering = ("-created_at",)
    inlines = (PayoutEventInline, LedgerEntryInline)


@admin.register(LedgerEntry)
class LedgerEntryAdmin(ReadOnlyAdmin):
    list_display = (
        "entry_id",
        "account",
        "direction",
        "amount_minor",
        "fence",
        "payout",
        "posted_at",
    )
    list_filter = ("direction",)
    search_fields = ("account__account_id", "payout__payout_id")
    ordering = ("-posted_at",)


class ResolveForm(forms.Form):
    resolution = forms.ChoiceField(
        choices=[("POSTED", "POSTED — the rail booked it once"), ("FAILED", "FAILED — not booked")]
    )
    note = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        help_text="Required: what you checked (rail statement, references) and why.",
    )
    rail_reference = forms.CharField(required=False, max_length=128)

    def clean_note(self):
        note = self.cleaned_data["note"].strip()
        if not note:
            raise forms.ValidationError("a note is required")
        return note


@admin.register(QuarantinedPayout)
class QuarantineAdmin(admin.ModelAdmin):
    """RAIL_AMBIGUOUS payouts with the reconciler's classification (payout_reconciliation)."""

    list_display = (
        "payout_id",
        "account",
        "amount_minor",
        "currency",
        "claim_token",
        "classification",
        "rail_transfers",
        "rail_references",
        "checked_at",
        "updated_at",
    )
    list_select_related = ("reconciliation",)
    search_fields = ("payout_id", "account__account_id")
    ordering = ("updated_at",)
    inlines = (PayoutEventInline,)
    actions = ("resolve_selected",)

    def get_queryset(self, request):
        return super().get_queryset(request).filter(state="RAIL_AMBIGUOUS")

    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in self.model._meta.fields]

    def has_add_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def save_model(self, request, obj, form, change):
        """Never save a payout from a form; resolution goes through the service."""

    def _recon(self, obj) -> PayoutReconciliation | None:
        try:
            return obj.reconciliation
        except PayoutReconciliation.DoesNotExist:
            return None

    @admin.display(description="reconciler classification")
    def classification(self, obj):
        recon = self._recon(obj)
        return recon.classification if recon else "not yet reconciled"

    @admin.display(description="rail transfers")
    def rail_transfers(self, obj):
        recon = self._recon(obj)
        return recon.rail_transfer_count if recon else None

    @admin.display(description="rail references")
    def rail_references(self, obj):
        recon = self._recon(obj)
        return ", ".join(map(str, recon.rail_references or [])) if recon else ""

    @admin.display(description="checked at")
    def checked_at(self, obj):
        recon = self._recon(obj)
        return recon.checked_at if recon else None

    @admin.action(description="Resolve selected quarantined payouts…", permissions=["change"])
    def resolve_selected(self, request, queryset):
        form = ResolveForm(request.POST if "apply" in request.POST else None)
        if "apply" in request.POST and form.is_valid():
            resolved = 0
            for payout in queryset:
                try:
                    services.resolve_quarantined(
                        payout_id=payout.payout_id,
                        resolution=form.cleaned_data["resolution"],
                        operator=request.user.get_username(),
                        note=form.cleaned_data["note"],
                        rail_reference=form.cleaned_data["rail_reference"] or None,
                    )
                    resolved += 1
                except ApiError as exc:
                    self.message_user(
                        request, f"{payout.payout_id}: {exc.code} {exc.message}", messages.ERROR
                    )
            if resolved:
                self.message_user(
                    request,
                    f"{resolved} payout(s) resolved as {form.cleaned_data['resolution']}",
                    messages.SUCCESS,
                )
            return None
        return TemplateResponse(
            request,
            "admin/payments/resolve.html",
            {
                **self.admin_site.each_context(request),
                "title": "Resolve quarantined payouts",
                "opts": self.model._meta,
                "payouts": queryset,
                "form": form,
                "action_checkbox_name": admin.helpers.ACTION_CHECKBOX_NAME,
            },
        )
