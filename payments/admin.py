"""Staff admin: read-only books, the payout timeline, and the RAIL_AMBIGUOUS quarantine.

Nothing here writes a row directly: the only write is the quarantine's resolve (a page per payout
and a changelist action), which goes through the guarded `payments.resolve.resolve_payout`
(the reconciler must back the resolution, or the operator overrides with a written reason).
Every time is shown to the second, in UTC.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse

from dlock.errors import ApiError
from payments.models import (
    Account,
    LedgerEntry,
    Payout,
    PayoutEvent,
    PayoutReconciliation,
    QuarantinedPayout,
)
from payments.resolve import OVERRIDE_REASON_MIN, resolve_payout
from railproxy.models import RailSubmission

if TYPE_CHECKING:
    from django.db.models import Model, QuerySet
    from django.http import HttpRequest, HttpResponse
    from django.urls import URLPattern


def utc(value: dt.datetime | None) -> str:
    """2026-12-01 03:00:07.123 UTC: an operator compares these with the rail's statement."""
    if value is None:
        return "—"
    value = value.astimezone(dt.UTC)
    return value.strftime("%Y-%m-%d %H:%M:%S.") + f"{value.microsecond // 1000:03d} UTC"


class ReadOnlyAdmin(admin.ModelAdmin):
    """View-only: money and history change through the fenced services, never a form."""

    def has_add_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False


@admin.register(Account)
class AccountAdmin(ReadOnlyAdmin):
    list_display = ("account_id", "kind", "currency", "balance_minor", "fence", "updated_at_utc")
    list_filter = ("kind", "currency")
    search_fields = ("account_id",)

    @admin.display(description="updated at (UTC)", ordering="updated_at")
    def updated_at_utc(self, obj: Account) -> str:
        return utc(obj.updated_at)


class ReadOnlyInline(admin.TabularInline):
    """A payout's history rows, shown and never edited, added or deleted."""

    extra = 0
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False


class PayoutEventInline(ReadOnlyInline):
    model = PayoutEvent
    fields = ("at_utc", "from_state", "to_state", "token", "owner_id", "note")
    readonly_fields = fields
    ordering = ("at", "id")

    @admin.display(description="at (UTC)")
    def at_utc(self, obj: PayoutEvent) -> str:
        return utc(obj.at)


class LedgerEntryInline(ReadOnlyInline):
    model = LedgerEntry
    fk_name = "payout"
    fields = ("entry_id", "account", "direction", "amount_minor", "fence", "posted_at_utc")
    readonly_fields = fields

    @admin.display(description="posted at (UTC)")
    def posted_at_utc(self, obj: LedgerEntry) -> str:
        return utc(obj.posted_at)


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
        "created_at_utc",
    )
    list_filter = ("state", "currency")
    search_fields = ("payout_id", "account__account_id", "rail_reference")
    ordering = ("-created_at",)
    inlines = (PayoutEventInline, LedgerEntryInline)

    @admin.display(description="created at (UTC)", ordering="created_at")
    def created_at_utc(self, obj: Payout) -> str:
        return utc(obj.created_at)


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

    @admin.display(description="posted at (UTC)", ordering="posted_at")
    def posted_at_utc(self, obj: LedgerEntry) -> str:
        return utc(obj.posted_at)


class ResolveForm(forms.Form):
    resolution = forms.ChoiceField(
        choices=[("POSTED", "POSTED — the rail booked it once"), ("FAILED", "FAILED — not booked")]
    )
    rail_reference = forms.CharField(
        required=False,
        max_length=128,
        help_text="For POSTED: the reference on the rail's statement (default: the one the "
        "reconciler found).",
    )
    note = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        help_text="Required: what you checked (rail statement, references) and why.",
    )
    override = forms.BooleanField(
        required=False,
        label="Override the reconciler",
        help_text=f"Resolve although the reconciler's latest finding does not support it; the "
        f"note must then give the reason (at least {OVERRIDE_REASON_MIN} characters). Logged "
        "at WARNING.",
    )

    def clean_note(self) -> str:
        note = self.cleaned_data["note"].strip()
        if not note:
            raise forms.ValidationError("a note is required")
        return note

    def clean(self) -> dict[str, Any] | None:
        cleaned = super().clean()
        note = cleaned.get("note") or ""
        if cleaned.get("override") and len(note) < OVERRIDE_REASON_MIN:
            self.add_error(
                "note", f"an override needs a reason of at least {OVERRIDE_REASON_MIN} characters"
            )
        return cleaned


@admin.register(QuarantinedPayout)
class QuarantineAdmin(admin.ModelAdmin):
    """RAIL_AMBIGUOUS payouts with the reconciler's classification (payout_reconciliation).

    The detail page is view-only (no Save): it shows the classification, the rail references,
    every rail submission attempt and the event timeline; "Resolve…" opens the guarded form.
    """

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
        "updated_at_utc",
    )
    list_select_related = ("reconciliation",)
    search_fields = ("payout_id", "account__account_id")
    ordering = ("updated_at",)
    actions = ("resolve_selected",)
    change_form_template = "admin/payments/quarantine_change_form.html"

    def get_queryset(self, request: HttpRequest) -> QuerySet[QuarantinedPayout]:
        return super().get_queryset(request).filter(state="RAIL_AMBIGUOUS")

    def get_readonly_fields(
        self, request: HttpRequest, obj: QuarantinedPayout | None = None
    ) -> list[str]:
        return [f.name for f in self.model._meta.fields]

    def has_add_permission(
        self, request: HttpRequest, obj: QuarantinedPayout | None = None
    ) -> bool:
        return False

    def has_delete_permission(
        self, request: HttpRequest, obj: QuarantinedPayout | None = None
    ) -> bool:
        return False

    def has_change_permission(
        self, request: HttpRequest, obj: QuarantinedPayout | None = None
    ) -> bool:
        # The changelist's resolve action needs "change"; a payout's own page never saves.
        return obj is None and super().has_change_permission(request)

    def get_urls(self) -> list[URLPattern]:
        resolve = path(
            "<path:object_id>/resolve/",
            self.admin_site.admin_view(self.resolve_view),
            name="payments_quarantinedpayout_resolve",
        )
        return [resolve, *super().get_urls()]

    def _recon(self, obj: Payout) -> PayoutReconciliation | None:
        try:
            return obj.reconciliation
        except PayoutReconciliation.DoesNotExist:
            return None

    @admin.display(description="reconciler classification")
    def classification(self, obj: QuarantinedPayout) -> str:
        recon = self._recon(obj)
        return recon.classification if recon else "not yet reconciled"

    @admin.display(description="rail transfers")
    def rail_transfers(self, obj: QuarantinedPayout) -> int | None:
        recon = self._recon(obj)
        return recon.rail_transfer_count if recon else None

    @admin.display(description="rail references")
    def rail_references(self, obj: QuarantinedPayout) -> str:
        recon = self._recon(obj)
        return ", ".join(map(str, recon.rail_references or [])) if recon else ""

    @admin.display(description="checked at (UTC)")
    def checked_at(self, obj: QuarantinedPayout) -> str | None:
        recon = self._recon(obj)
        return utc(recon.checked_at) if recon else None

    @admin.display(description="updated at (UTC)", ordering="updated_at")
    def updated_at_utc(self, obj: QuarantinedPayout) -> str:
        return utc(obj.updated_at)

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        payout = self.get_object(request, object_id)
        context = dict(extra_context or {})
        if payout is not None:
            context.update(self._evidence(payout))
            context["resolve_url"] = reverse(
                "admin:payments_quarantinedpayout_resolve", args=[payout.pk]
            )
        return super().change_view(request, object_id, form_url, extra_context=context)

    def _evidence(self, payout: Payout) -> dict:
        """What an operator needs to decide: the reconciler's finding, the submission attempts
        (presented token, outcome, times), and the timeline; every time in UTC to the second."""
        recon = self._recon(payout)
        submissions = RailSubmission.objects.filter(payout_id=payout.payout_id).order_by(
            "submitted_at"
        )
        events = PayoutEvent.objects.filter(payout_id=payout.payout_id).order_by("at", "id")
        return {
            "recon": recon,
            "recon_checked_at": utc(recon.checked_at) if recon else None,
            "recon_references": ", ".join(map(str, recon.rail_references or [])) if recon else "",
            "submissions": [
                {"row": s, "submitted_at": utc(s.submitted_at), "resolved_at": utc(s.resolved_at)}
                for s in submissions
            ],
            "events": [{"row": e, "at": utc(e.at)} for e in events],
        }

    def resolve_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """One payout's resolve form: GET shows it with the evidence, POST resolves (guarded)."""
        if not self.has_change_permission(request):
            raise PermissionDenied
        payout = get_object_or_404(self.get_queryset(request), pk=object_id)
        form = ResolveForm(request.POST if request.method == "POST" else None)
        if request.method == "POST" and form.is_valid() and self._resolve(request, payout, form):
            return HttpResponseRedirect(reverse("admin:payments_quarantinedpayout_changelist"))
        return self._form_page(request, [payout], form, evidence=self._evidence(payout))

    def _resolve(self, request: HttpRequest, payout: Payout, form: ResolveForm) -> bool:
        data = form.cleaned_data
        try:
            done = resolve_payout(
                payout_id=payout.payout_id,
                resolution=data["resolution"],
                user=request.user,
                note=data["note"],
                rail_reference=data["rail_reference"] or None,
                override=data["override"],
            )
        except ApiError as exc:
            self.message_user(request, f"{payout.payout_id}: {exc.message}", messages.ERROR)
            return False
        suffix = " (override)" if done.override else ""
        self.message_user(
            request,
            f"{payout.payout_id} resolved as {done.to_state}{suffix}",
            messages.WARNING if done.override else messages.SUCCESS,
        )
        return True

    def _form_page(
        self,
        request: HttpRequest,
        payouts: list[QuarantinedPayout],
        form: ResolveForm,
        *,
        evidence: dict | None = None,
        action: bool = False,
    ) -> TemplateResponse:
        return TemplateResponse(
            request,
            "admin/payments/resolve.html",
            {
                **self.admin_site.each_context(request),
                "title": "Resolve quarantined payouts",
                "opts": self.model._meta,
                "payouts": payouts,
                "form": form,
                "evidence": evidence,
                "from_action": action,
                "action_checkbox_name": admin.helpers.ACTION_CHECKBOX_NAME,
            },
        )

    @admin.action(description="Resolve selected quarantined payouts…", permissions=["change"])
    def resolve_selected(
        self, request: HttpRequest, queryset: QuerySet[QuarantinedPayout]
    ) -> TemplateResponse | None:
        form = ResolveForm(request.POST if "apply" in request.POST else None)
        if "apply" in request.POST and form.is_valid():
            for payout in queryset:
                self._resolve(request, payout, form)
            return None  # back to the changelist, with one message per payout
        return self._form_page(request, list(queryset), form, action=True)
