"""What every section of the payments admin shares: the UTC time display, the declared
permissions, an object's page context and own pages, and the payout's evidence (with the hook
other apps add their sections through)."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.urls import path, reverse

from payments.models import Payout, PayoutEvent, PayoutReconciliation, RailRecovery

if TYPE_CHECKING:
    from django.db.models import Model
    from django.http import HttpRequest, HttpResponse
    from django.urls import URLPattern


def utc(value: dt.datetime | None) -> str:
    """2026-12-01 03:00:07.123 UTC: an operator compares these with the rail's statement."""
    if value is None:
        return "—"
    value = value.astimezone(dt.UTC)
    return value.strftime("%Y-%m-%d %H:%M:%S.") + f"{value.microsecond // 1000:03d} UTC"


def utc_column(field: str, description: str | None = None) -> Callable[[Any, Model], str]:
    """A display column showing the model's `field` with `utc`, sortable by the field:
    `updated_at_utc = utc_column("updated_at")` is titled "updated at (UTC)"."""

    def column(self: Any, obj: Model) -> str:
        return utc(getattr(obj, field))

    title = description or f"{field.replace('_', ' ')} (UTC)"
    return admin.display(description=title, ordering=field)(column)


class DeclaredPermissions:
    """An admin's add/change/delete rights declared as attributes, not one method each.

    `change`: "never" (view-only pages), "changelist" (the changelist's actions may change, a
    row's own page never saves) or "granted" (Django's permission decides). `add` and `delete`
    are False (never) or True (Django's permission decides). `view_also`: a permission that
    also grants viewing (a proxy model shown to whoever may view its concrete model).
    """

    add = False
    change = "never"
    delete = False
    view_also: str | None = None

    def has_add_permission(self, request: HttpRequest, *obj: Model | None) -> bool:
        return self.add and super().has_add_permission(request, *obj)  # type: ignore[misc]

    def has_change_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        if self.change == "never" or (self.change == "changelist" and obj is not None):
            return False
        return super().has_change_permission(request, obj)  # type: ignore[misc]

    def has_delete_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return self.delete and super().has_delete_permission(request, obj)  # type: ignore[misc]

    def has_view_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        allowed = super().has_view_permission(request, obj)  # type: ignore[misc]
        return allowed or (self.view_also is not None and request.user.has_perm(self.view_also))


class ObjectPages:
    """An admin whose object's page gets context from the object (`page_context`), and whose
    own views sit below the object's URL (`object_page`). Listed before the ModelAdmin."""

    def page_context(self, obj: Any) -> dict[str, Any]:
        return {}

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        context = dict(extra_context or {})
        obj = self.get_object(request, object_id)  # type: ignore[attr-defined]
        if obj is not None:
            context.update(self.page_context(obj))
        return super().change_view(  # type: ignore[misc]
            request, object_id, form_url, extra_context=context
        )

    def object_page(self, suffix: str, view: Callable[..., HttpResponse], name: str) -> URLPattern:
        """`<object_id>/<suffix>/` served by `view` behind the admin's log-in, named `name`."""
        return path(
            f"<path:object_id>/{suffix}/",
            self.admin_site.admin_view(view),  # type: ignore[attr-defined]
            name=name,
        )


class ReadOnlyAdmin(DeclaredPermissions, admin.ModelAdmin):
    """View-only: money and history change through the fenced services, never a form."""


class ReadOnlyInline(DeclaredPermissions, admin.TabularInline):
    """A payout's history rows, shown and never edited, added or deleted."""

    extra = 0
    can_delete = False


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


def is_uuid(value: str) -> bool:
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
