"""Rail recoveries: transfers no POSTED payout accounts for, and their append-only history."""

from __future__ import annotations

import uuid

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from payments.models.books import Payout
from payments.models.states import amount_positive, currency_iso4217, reason_given, valid_choice


class RecoveryStatus(models.TextChoices):
    OPEN = "OPEN"
    RECOVERED = "RECOVERED"
    WRITTEN_OFF = "WRITTEN_OFF"


class RailRecovery(models.Model):
    """A rail transfer no POSTED payout accounts for (a duplicate ack; the booked transfer of a
    payout resolved FAILED), recorded by an operator from the reconciler's evidence.

    Recording books DEBIT `recoverable:rail:<currency>`, CREDIT `settlement:<currency>` (the
    money left through the rail); closing books CREDIT recoverable against DEBIT settlement
    (RECOVERED: the money came back, with the rail's reference) or DEBIT `loss:rail:<currency>`
    (WRITTEN_OFF, with a reason). Written only by payments/recovery.py; one per rail transfer.
    """

    recovery_id = models.UUIDField(primary_key=True, default=uuid.uuid4)
    rail_reference = models.CharField(max_length=64, unique=True)
    client_ref = models.CharField(max_length=128)
    payout = models.ForeignKey(
        Payout,
        on_delete=models.PROTECT,
        db_column="payout_id",
        null=True,
        blank=True,
        related_name="recoveries",
    )
    amount_minor = models.BigIntegerField()
    currency = models.CharField(max_length=3)
    status = models.CharField(max_length=12, choices=RecoveryStatus.choices, default="OPEN")
    classification = models.CharField(max_length=16)  # the reconciler's, when recorded
    reason = models.TextField()
    recorded_by = models.CharField(max_length=150)
    recorded_at = models.DateTimeField(db_default=Now())
    closed_by = models.CharField(max_length=150, null=True, blank=True)  # noqa: DJ001
    closed_at = models.DateTimeField(null=True, blank=True)
    close_reference = models.CharField(max_length=128, null=True, blank=True)  # noqa: DJ001
    close_reason = models.TextField(null=True, blank=True)  # noqa: DJ001

    class Meta:
        db_table = "rail_recovery"
        verbose_name_plural = "rail recoveries"
        ordering = ["recorded_at", "rail_reference"]
        constraints = [
            amount_positive("rail_recovery"),
            valid_choice("rail_recovery", "status", RecoveryStatus),
            reason_given("rail_recovery"),
            currency_iso4217("rail_recovery"),
            # OPEN has no closing fields; RECOVERED has the rail's reference; WRITTEN_OFF a reason.
            models.CheckConstraint(
                condition=(
                    Q(status="OPEN", closed_at__isnull=True, closed_by__isnull=True)
                    | Q(status="RECOVERED", closed_at__isnull=False, close_reference__gt="")
                    | Q(status="WRITTEN_OFF", closed_at__isnull=False, close_reason__gt="")
                ),
                name="rail_recovery_closed_consistently",
            ),
        ]
        indexes = [models.Index(fields=["status", "recorded_at"], name="rail_recovery_open_idx")]

    def __str__(self) -> str:
        return f"{self.rail_reference} ({self.status})"


class RailRecoveryEvent(models.Model):
    """Append-only history of a rail recovery: RECORDED, then RECOVERED or WRITTEN_OFF."""

    id = models.BigAutoField(primary_key=True)
    recovery = models.ForeignKey(
        RailRecovery, on_delete=models.PROTECT, db_column="recovery_id", related_name="events"
    )
    action = models.CharField(max_length=12)
    operator = models.CharField(max_length=150)
    reference = models.CharField(max_length=128, null=True, blank=True)  # noqa: DJ001
    note = models.TextField()
    at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "rail_recovery_event"
        ordering = ["at", "id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(action__in=["RECORDED", "RECOVERED", "WRITTEN_OFF"]),
                name="rail_recovery_event_action_valid",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.action} by {self.operator}"
