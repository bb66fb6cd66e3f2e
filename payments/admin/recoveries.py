"""Rail recoveries: transfers no POSTED payout accounts for, recorded and closed through
`payments.recovery` (the reconciler's evidence guards both)."""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import reverse

from dlock.errors import ApiError
from payments.admin.base import DeclaredPermissions, ObjectPages, ReadOnlyInline, utc_column
from payments.models import LedgerEntry, RailRecovery, RailRecoveryEvent
from payments.recovery import REASON_MIN, close_recovery, record_recovery

if TYPE_CHECKING:
    from django.http import HttpRequest, HttpResponse
    from django.urls import URLPattern


class RecordRecoveryForm(forms.Form):
    transfer = forms.CharField(
        max_length=64,
        label="Rail transfer (the statement's reference)",
        help_text="A transfer the reconciler found that no POSTED payout accounts for: a "
        "duplicate ack, or the booked transfer of a payout resolved FAILED.",
    )
    reason = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        min_length=REASON_MIN,
        help_text=f"Required (at least {REASON_MIN} characters): what the statement shows.",
    )


class CloseRecoveryForm(forms.Form):
    outcome = forms.ChoiceField(
        choices=[
            ("RECOVERED", "RECOVERED — the money came back (give the rail's reference)"),
            ("WRITTEN_OFF", "WRITTEN_OFF — it will not come back (give the reason)"),
        ],
        widget=forms.RadioSelect,
    )
    reference = forms.CharField(
        required=False, max_length=128, help_text="RECOVERED: the rail's reference of the return."
    )
    reason = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        help_text=f"WRITTEN_OFF: why (at least {REASON_MIN} characters).",
    )


class RailRecoveryEventInline(ReadOnlyInline):
    model = RailRecoveryEvent
    fields = ("at_utc", "action", "operator", "reference", "note")
    readonly_fields = fields
    at_utc = utc_column("at")


class RecoveryLedgerInline(ReadOnlyInline):
    model = LedgerEntry
    fk_name = "recovery"
    fields = ("entry_id", "account", "direction", "amount_minor", "posted_at_utc")
    readonly_fields = fields
    verbose_name_plural = "ledger entries"
    posted_at_utc = utc_column("posted_at")


@admin.register(RailRecovery)
class RailRecoveryAdmin(ObjectPages, DeclaredPermissions, admin.ModelAdmin):
    """Rail transfers no POSTED payout accounts for, booked to the receivable until closed.

    "Add" is the guarded record form (payments.recovery.record_recovery); a recovery's page is
    view-only with "Close…" (RECOVERED or WRITTEN_OFF). No row is edited or deleted here.
    """

    list_display = (
        "rail_reference",
        "payout",
        "amount_minor",
        "currency",
        "status",
        "classification",
        "recorded_by",
        "recorded_at_utc",
        "closed_at_utc",
        "age",
    )
    list_filter = ("status", "currency")
    search_fields = ("rail_reference", "client_ref", "close_reference")
    ordering = ("-recorded_at",)
    inlines = (RailRecoveryEventInline, RecoveryLedgerInline)
    change_form_template = "admin/payments/recovery_change_form.html"
    add = True  # the guarded record form, below
    change = "changelist"  # "Close…" (close_view) asks for it; a recovery's page never saves

    def get_readonly_fields(self, request: HttpRequest, obj: RailRecovery | None = None) -> list:
        return [f.name for f in self.model._meta.fields]

    recorded_at_utc = utc_column("recorded_at")
    closed_at_utc = utc_column("closed_at")

    @admin.display(description="open for")
    def age(self, obj: RailRecovery) -> str:
        if obj.status != "OPEN":
            return "—"
        seconds = int((dt.datetime.now(dt.UTC) - obj.recorded_at).total_seconds())
        return f"{seconds // 86400}d {seconds % 86400 // 3600}h {seconds % 3600 // 60}m"

    def get_urls(self) -> list[URLPattern]:
        close = self.object_page("close", self.close_view, "payments_railrecovery_close")
        return [close, *super().get_urls()]

    def page_context(self, obj: RailRecovery) -> dict[str, Any]:
        if obj.status != "OPEN":
            return {}
        return {"close_url": reverse("admin:payments_railrecovery_close", args=[obj.pk])}

    def add_view(
        self, request: HttpRequest, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """The guarded record form (not a model form): transfer reference and reason."""
        if not self.has_add_permission(request):
            raise PermissionDenied
        initial = {"transfer": request.GET.get("transfer", "")}
        form = RecordRecoveryForm(
            request.POST if request.method == "POST" else None, initial=initial
        )
        if request.method == "POST" and form.is_valid():
            try:
                step = record_recovery(
                    rail_reference=form.cleaned_data["transfer"],
                    reason=form.cleaned_data["reason"],
                    user=request.user,
                )
            except ApiError as exc:
                self.message_user(
                    request,
                    f"transfer {form.cleaned_data['transfer']}: {exc.message}",
                    messages.ERROR,
                )
            else:
                self.message_user(
                    request,
                    f"rail recovery recorded for transfer {step['railReference']} (payout "
                    f"{step['payoutId']}, {step['amountMinor']} {step['currency']}): OPEN",
                    messages.SUCCESS,
                )
                return HttpResponseRedirect(
                    reverse("admin:payments_railrecovery_change", args=[step["recoveryId"]])
                )
        return self._page(request, "Record a rail recovery", form, submit="Record recovery")

    def close_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        if not self.has_change_permission(request):
            raise PermissionDenied
        recovery = get_object_or_404(RailRecovery, pk=object_id)
        form = CloseRecoveryForm(request.POST if request.method == "POST" else None)
        if request.method == "POST" and form.is_valid():
            data = form.cleaned_data
            try:
                step = close_recovery(
                    rail_reference=recovery.rail_reference,
                    outcome=data["outcome"],
                    user=request.user,
                    reference=data["reference"] or None,
                    reason=data["reason"] or None,
                )
            except ApiError as exc:
                self.message_user(
                    request, f"transfer {recovery.rail_reference}: {exc.message}", messages.ERROR
                )
            else:
                self.message_user(
                    request,
                    f"rail recovery of transfer {step['railReference']} closed {step['status']}",
                    messages.SUCCESS,
                )
                return HttpResponseRedirect(
                    reverse("admin:payments_railrecovery_change", args=[recovery.pk])
                )
        return self._page(
            request,
            f"Close the rail recovery of transfer {recovery.rail_reference}",
            form,
            submit="Close recovery",
            recovery=recovery,
        )

    def _page(
        self,
        request: HttpRequest,
        title: str,
        form: forms.Form,
        *,
        submit: str,
        recovery: RailRecovery | None = None,
    ) -> TemplateResponse:
        return TemplateResponse(
            request,
            "admin/payments/recovery_form.html",
            {
                **self.admin_site.each_context(request),
                "title": title,
                "opts": self.model._meta,
                "form": form,
                "submit": submit,
                "recovery": recovery,
            },
        )
