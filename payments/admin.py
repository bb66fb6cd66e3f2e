"""Staff admin: read-only books, the payout timeline, and the RAIL_AMBIGUOUS quarantine.

Nothing here writes a row directly: the writes are the quarantine's resolve (a page per payout
and a changelist action), through the guarded `payments.resolve.resolve_payout` (the reconciler
must back the resolution, or the operator overrides with a written reason), and the rail
recoveries' record and close pages, through `payments.recovery` (the reconciler's evidence
guards them). Every time is shown to the second, in UTC (settings/formats). payments imports
no app above it: apps that add evidence to a payout's page (railproxy/admin.py: the rail
submission attempts) register a provider with `register_evidence`.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models.expressions import RawSQL
from django.http import HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse

from dlock.errors import ApiError
from payments import audit
from payments.models import (
    Account,
    LedgerEntry,
    Payout,
    PayoutEvent,
    PayoutReconciliation,
    QuarantinedPayout,
    RailRecovery,
    RailRecoveryEvent,
)
from payments.recovery import REASON_MIN, close_recovery, record_recovery, recovered_references
from payments.resolve import OVERRIDE_REASON_MIN, allowed_resolution, resolve_payout
from payments.selectors import balance_sql

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


# Providers of more evidence for a payout's page: payout -> template context (e.g.
# {"submissions": [...]}, railproxy/admin.py). The dependency points from those apps to this one.
EVIDENCE_PROVIDERS: list[Callable[[Payout], dict[str, Any]]] = []


def register_evidence(
    provider: Callable[[Payout], dict[str, Any]],
) -> Callable[[Payout], dict[str, Any]]:
    if provider not in EVIDENCE_PROVIDERS:
        EVIDENCE_PROVIDERS.append(provider)
    return provider


def payout_evidence(payout: Payout, *, recon: PayoutReconciliation | None) -> dict[str, Any]:
    """What an operator needs to decide: the reconciler's finding with the statement's
    transfers (and which a rail recovery accounts for), the evidence providers' sections (the
    rail submission attempts), and the timeline; every time in UTC to the second."""
    recovered = {r.rail_reference: r for r in RailRecovery.objects.filter(payout_id=payout.pk)}
    transfers = []
    for t in (recon.rail_transfers or []) if recon else []:
        ref = str(t.get("railReference"))
        recovery = recovered.get(ref)
        transfers.append(
            {
                "reference": ref,
                "amount": t.get("amountMinor"),
                "currency": t.get("currency"),
                "accepted_at": t.get("acceptedAt"),
                "recovery": recovery,
                "recovery_url": reverse("admin:payments_railrecovery_change", args=[recovery.pk])
                if recovery
                else None,
                "record_url": None
                if recovery or (payout.state == "POSTED" and payout.rail_reference == ref)
                else reverse("admin:payments_railrecovery_add") + f"?transfer={ref}",
                "accounts_for_payout": payout.state == "POSTED" and payout.rail_reference == ref,
            }
        )
    events = PayoutEvent.objects.filter(payout_id=payout.payout_id).order_by("at", "id")
    context: dict[str, Any] = {
        "recon": recon,
        "recon_checked_at": utc(recon.checked_at) if recon else None,
        "recon_references": ", ".join(map(str, recon.rail_references or [])) if recon else "",
        "transfers": transfers,
        "events": [{"row": e, "at": utc(e.at)} for e in events],
    }
    for provider in EVIDENCE_PROVIDERS:
        context.update(provider(payout))
    return context


def _is_uuid(value: str) -> bool:
    try:
        uuid.UUID(str(value))
    except ValueError:
        return False
    return True


def resolved_by(payout: Payout) -> str:
    """ "payout P is POSTED: resolved by alice at …Z (reference R)" from its latest step out of
    quarantine (its payout_event row), or its state when it never was quarantined."""
    event = (
        PayoutEvent.objects.filter(payout_id=payout.pk, from_state="RAIL_AMBIGUOUS")
        .order_by("-at", "-id")
        .first()
    )
    if event is None:
        return f"payout {payout.pk} is {payout.state}, not in quarantine"
    who = (event.owner_id or "").removeprefix("operator:") or "unknown"
    ref = f" (reference {payout.rail_reference})" if payout.rail_reference else ""
    return (
        f"payout {payout.pk} is {payout.state}: resolved {event.to_state} by {who} at "
        f"{utc(event.at)}{ref}"
    )


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
    """The balance shown is the account's balance (selectors.balance_sql): a settlement
    account's row holds only part of it, the rest is in its buckets (issue 28 item 3)."""

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
    change_form_template = "admin/payments/payout_change_form.html"

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        context = dict(extra_context or {})
        payout = self.get_object(request, object_id)
        if payout is not None:
            recon = PayoutReconciliation.objects.filter(payout_id=payout.pk).first()
            context.update(payout_evidence(payout, recon=recon))
        return super().change_view(request, object_id, form_url, extra_context=context)

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

    def has_view_permission(
        self, request: HttpRequest, obj: QuarantinedPayout | None = None
    ) -> bool:
        # The proxy's own view permission, or the payout's (the concrete model).
        return super().has_view_permission(request, obj) or request.user.has_perm(
            "payments.view_payout"
        )

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
            payout = Payout.objects.filter(pk=object_id).first() if _is_uuid(object_id) else None
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
        suffix = " (override)" if done.override else ""
        self.message_user(
            request,
            f"payout {payout.payout_id} resolved as {done.to_state}{suffix}",
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

    @admin.display(description="at (UTC)")
    def at_utc(self, obj: RailRecoveryEvent) -> str:
        return utc(obj.at)


class RecoveryLedgerInline(ReadOnlyInline):
    model = LedgerEntry
    fk_name = "recovery"
    fields = ("entry_id", "account", "direction", "amount_minor", "posted_at_utc")
    readonly_fields = fields
    verbose_name_plural = "ledger entries"

    @admin.display(description="posted at (UTC)")
    def posted_at_utc(self, obj: LedgerEntry) -> str:
        return utc(obj.posted_at)


@admin.register(RailRecovery)
class RailRecoveryAdmin(admin.ModelAdmin):
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

    def get_readonly_fields(self, request: HttpRequest, obj: RailRecovery | None = None) -> list:
        return [f.name for f in self.model._meta.fields]

    def has_delete_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return obj is None and super().has_change_permission(request)

    @admin.display(description="recorded at (UTC)", ordering="recorded_at")
    def recorded_at_utc(self, obj: RailRecovery) -> str:
        return utc(obj.recorded_at)

    @admin.display(description="closed at (UTC)", ordering="closed_at")
    def closed_at_utc(self, obj: RailRecovery) -> str:
        return utc(obj.closed_at)

    @admin.display(description="open for")
    def age(self, obj: RailRecovery) -> str:
        if obj.status != "OPEN":
            return "—"
        seconds = int((dt.datetime.now(dt.UTC) - obj.recorded_at).total_seconds())
        return f"{seconds // 86400}d {seconds % 86400 // 3600}h {seconds % 3600 // 60}m"

    def get_urls(self) -> list[URLPattern]:
        close = path(
            "<path:object_id>/close/",
            self.admin_site.admin_view(self.close_view),
            name="payments_railrecovery_close",
        )
        return [close, *super().get_urls()]

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        context = dict(extra_context or {})
        recovery = self.get_object(request, object_id)
        if recovery is not None and recovery.status == "OPEN":
            context["close_url"] = reverse("admin:payments_railrecovery_close", args=[recovery.pk])
        return super().change_view(request, object_id, form_url, extra_context=context)

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
                    f"rail recovery recorded for transfer {step.rail_reference} (payout "
                    f"{step.payout_id}, {step.amount_minor} {step.currency}): OPEN",
                    messages.SUCCESS,
                )
                return HttpResponseRedirect(
                    reverse("admin:payments_railrecovery_change", args=[step.recovery_id])
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
                    f"rail recovery of transfer {step.rail_reference} closed {step.status}",
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


@admin.register(PayoutReconciliation)
class ReconciliationAdmin(ReadOnlyAdmin):
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

    @admin.display(description="checked at (UTC)", ordering="checked_at")
    def checked_at_utc(self, obj: PayoutReconciliation) -> str:
        return utc(obj.checked_at)

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        context = dict(extra_context or {})
        recon = self.get_object(request, object_id)
        if recon is not None:
            context.update(payout_evidence(recon.payout, recon=recon))
        return super().change_view(request, object_id, form_url, extra_context=context)
