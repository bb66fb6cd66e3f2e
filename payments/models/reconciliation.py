"""What the reconciler writes: its latest finding per payout (and the quarantine seen through
it), and one row per run."""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from payments.models.books import Payout
from payments.models.states import valid_choice


class ReconClassification(models.TextChoices):
    NOT_BOOKED = "NOT_BOOKED"
    BOOKED_ONCE = "BOOKED_ONCE"
    BOOKED_MULTIPLE = "BOOKED_MULTIPLE"
    NO_SUBMISSION = "NO_SUBMISSION"


class PayoutReconciliation(models.Model):
    """Reconciler findings per payout (written by `manage.py reconcile`, read by the admin)."""

    payout = models.OneToOneField(
        Payout,
        on_delete=models.CASCADE,
        primary_key=True,
        db_column="payout_id",
        related_name="reconciliation",
    )
    classification = models.CharField(max_length=16, choices=ReconClassification.choices)
    rail_transfer_count = models.IntegerField(default=0)
    rail_references = models.JSONField(default=list)
    # The statement's rows behind rail_references: [{railReference, amountMinor, currency,
    # acceptedAt}], the evidence a rail recovery is recorded from.
    rail_transfers = models.JSONField(default=list, db_default=[])
    checked_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "payout_reconciliation"
        constraints = [
            valid_choice("payout_reconciliation", "classification", ReconClassification),
            models.CheckConstraint(
                condition=Q(rail_transfer_count__gte=0),
                name="payout_reconciliation_count_non_negative",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.payout_id}: {self.classification}"


class QuarantinedPayout(Payout):
    """Admin view of RAIL_AMBIGUOUS payouts (proxy: no table of its own)."""

    class Meta:
        proxy = True
        verbose_name = "quarantined payout"
        verbose_name_plural = "quarantine (RAIL_AMBIGUOUS)"


class ReconcileRun(models.Model):
    """One `manage.py reconcile` run's result, exported by payments' /metrics
    (payments/reconcile_metrics.py) so the reconciler's verdict reaches Prometheus."""

    run_id = models.BigAutoField(primary_key=True)
    ok = models.BooleanField()
    violations = models.IntegerField()
    classified = models.IntegerField()  # payouts given a classification this run
    counts = models.JSONField(default=dict)
    finished_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "reconcile_run"
        indexes = [models.Index(fields=["finished_at"], name="reconcile_run_finished_at")]

    def __str__(self) -> str:
        return f"reconcile {self.finished_at}: {'ok' if self.ok else 'BROKEN'}"
