"""The RAIL_AMBIGUOUS quarantine: each payout with the reconciler's classification, and its
resolve (a page per payout and a changelist action) through the guarded
`payments.resolve.resolve_payout`: the reconciler must back the resolution, or the operator
overrides with a written reason."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse

from dlock.errors import ApiError
from payments import audit
from payments.admin.base import (
    DeclaredPermissions,
    ObjectPages,
    is_uuid,
    payout_evidence,
    resolved_by,
    utc,
    utc_column,
)
from payments.models import Payout, PayoutReconciliation, QuarantinedPayout
from payments.recovery import recovered_references
from payments.resolve import OVERRIDE_REASON_MIN, allowed_resolution, resolve_payout

if TYPE_CHECKING:
    from django.db.models import QuerySet
    from django.http import HttpRequest, HttpResponse
    from django.urls import URLPattern


class ResolveForm(forms.Form):
    resolution = forms.ChoiceField(
        choices=[
            ("", "— choose: the reconciler backs neither —"),
            ("POSTED", "POSTED — the rail booked it once"),
            ("FAILED", "FAILED — not booked (or every booked transfer a rail recovery)"),
        ]
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
class QuarantineAdmin(ObjectPages, DeclaredPermissions, admin.ModelAdmin):
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

    # A payout's own page never saves; the changelist's resolve action needs "change". The
    # proxy's own view permission, or the payout's (the concrete model), shows the pages.
    change = "changelist"
    view_also = "payments.view_payout"

    def get_urls(self) -> list[URLPattern]:
        resolve = self.object_page(
            "resolve", self.resolve_view, "payments_quarantinedpayout_resolve"
        )
        return [resolve, *super().get_urls()]

    def history_view(
        self, request: HttpRequest, object_id: str, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """The payout's own history: resolutions and refusals are logged on the payout."""
        return HttpResponseRedirect(reverse("admin:payments_payout_history", args=[object_id]))

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

    updated_at_utc = utc_column("updated_at")

    def page_context(self, obj: QuarantinedPayout) -> dict[str, Any]:
        return {
            **self._evidence(obj),
            "resolve_url": reverse("admin:payments_quarantinedpayout_resolve", args=[obj.pk]),
        }

    def _evidence(self, payout: Payout) -> dict:
        return payout_evidence(payout, recon=self._recon(payout))

    def resolve_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """One payout's resolve form: GET shows it with the evidence, POST resolves (guarded)."""
        if not self.has_change_permission(request):
            raise PermissionDenied
        payout = self.get_object(request, object_id)
        if payout is None:  # resolved elsewhere meanwhile (a stale or repeated form), or no such
            return self._not_quarantined(request, [object_id])
        initial = {
            "resolution": allowed_resolution(self._recon(payout), recovered_references(payout.pk))
        }
        form = ResolveForm(request.POST if request.method == "POST" else None, initial=initial)
        if request.method == "POST" and form.is_valid() and self._resolve(request, payout, form):
            return HttpResponseRedirect(reverse("admin:payments_quarantinedpayout_changelist"))
        return self._form_page(request, [payout], form, evidence=self._evidence(payout))

    def _not_quarantined(self, request: HttpRequest, payout_ids: list[str]) -> HttpResponse:
        """An admin page, never an error body: per payout, who resolved it and when (its
        latest operator step), and the refusal recorded (payments.audit)."""
        target = reverse("admin:payments_quarantinedpayout_changelist")
        for object_id in payout_ids:
            payout = Payout.objects.filter(pk=object_id).first() if is_uuid(object_id) else None
            if payout is None:
                self.message_user(request, f"no payout {object_id}", messages.ERROR)
                continue
            text = resolved_by(payout)
            audit.refused(
                "payout_resolution_refused",
                operator=request.user.get_username(),
                user=request.user,
                action="resolve (stale form)",
                reason=text,
                model=Payout,
                object_type="payout",
                object_id=str(payout.pk),
                payoutId=str(payout.pk),
            )
            self.message_user(request, f"not resolved: {text}", messages.ERROR)
            if len(payout_ids) == 1:
                target = reverse("admin:payments_payout_change", args=[payout.pk])
        return HttpResponseRedirect(target)

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
            self.message_user(request, f"payout {payout.payout_id}: {exc.message}", messages.ERROR)
            return False
        suffix = " (override)" if done["override"] else ""
        self.message_user(
            request,
            f"payout {payout.payout_id} resolved as {done['toState']}{suffix}",
            messages.WARNING if done["override"] else messages.SUCCESS,
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
        selected = request.POST.getlist(admin.helpers.ACTION_CHECKBOX_NAME)
        gone = sorted(set(selected) - {str(p.pk) for p in queryset})
        if gone:  # resolved elsewhere since the changelist was shown
            self._not_quarantined(request, gone)
            if not queryset.exists():
                return None
        if "apply" in request.POST and form.is_valid():
            for payout in queryset:
                self._resolve(request, payout, form)
            return None  # back to the changelist, with one message per payout
        return self._form_page(request, list(queryset), form, action=True)
