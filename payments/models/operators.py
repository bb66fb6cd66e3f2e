"""Operators' records: fence repairs, payout reversals and refused operator steps."""

from __future__ import annotations

import uuid

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from payments.models.books import Payout
from payments.models.states import amount_positive, reason_given


class FenceRepair(models.Model):
    """Audit of one `manage.py repair_fence` (ops): an operator lowered a fence no legitimate
    token could pass to the highest token the lock server had issued. Append-only."""

    repair_id = models.BigAutoField(primary_key=True)
    account_id = models.CharField(max_length=64)
    operator = models.CharField(max_length=128)
    reason = models.TextField()
    lock_backend = models.CharField(max_length=8)
    issued_bound = models.BigIntegerField()  # highest token the lock server had issued
    old_fence = models.BigIntegerField()
    new_fence = models.BigIntegerField()
    old_rail_high_water = models.BigIntegerField(null=True)  # None: the proxy had no row
    new_rail_high_water = models.BigIntegerField(null=True)
    at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "fence_repair"
        indexes = [models.Index(fields=["account_id", "at"], name="fence_repair_account_at")]
        constraints = [
            models.CheckConstraint(
                condition=Q(new_fence__lte=models.F("old_fence")),
                name="fence_repair_never_raises",
            ),
            reason_given("fence_repair"),
        ]

    def __str__(self) -> str:
        return f"{self.account_id}: {self.old_fence} → {self.new_fence} by {self.operator}"


class PayoutReversal(models.Model):
    """A POSTED payout the rail's statement contradicts (its reference is not on it), reversed
    by an operator from the reconciler's evidence: DEBIT `settlement:<currency>`, CREDIT the
    payout's account, and the payout moves POSTED → FAILED. The posting's own legs stay as
    they were (a reversal, never an edit). Written only by payments/reversal.py; one per payout.
    """

    reversal_id = models.UUIDField(primary_key=True, default=uuid.uuid4)
    payout = models.OneToOneField(
        Payout, on_delete=models.PROTECT, db_column="payout_id", related_name="reversal"
    )
    rail_reference = models.CharField(max_length=64, null=True, blank=True)  # noqa: DJ001
    amount_minor = models.BigIntegerField()
    currency = models.CharField(max_length=3)
    classification = models.CharField(max_length=16)  # the reconciler's, when reversed
    statement_references = models.JSONField(default=list)  # what the statement had instead
    reason = models.TextField()
    reversed_by = models.CharField(max_length=150)
    reversed_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "payout_reversal"
        ordering = ["reversed_at"]
        constraints = [
            amount_positive("payout_reversal"),
            reason_given("payout_reversal"),
        ]

    def __str__(self) -> str:
        return f"reversal of {self.payout_id} ({self.rail_reference})"


class OperatorRefusal(models.Model):
    """One refused operator step (admin or ops command), whoever asked: a known staff user's
    refusal also leaves a LogEntry; an unknown `--operator`'s can leave only this row. Written
    only by payments/audit.py."""

    id = models.BigAutoField(primary_key=True)
    at = models.DateTimeField(db_default=Now())
    operator = models.CharField(max_length=150)
    known_user = models.BooleanField()
    action = models.CharField(max_length=64)  # e.g. resolve POSTED, record rail recovery
    object_type = models.CharField(max_length=32)  # payout, rail recovery, operator, ...
    object_id = models.CharField(max_length=200)
    reason = models.TextField()
    note = models.TextField(blank=True, default="")

    class Meta:
        db_table = "operator_refusal"
        ordering = ["at", "id"]
        indexes = [models.Index(fields=["object_id", "at"], name="operator_refusal_object_idx")]

    def __str__(self) -> str:
        return f"{self.operator}: {self.action} {self.object_id} refused"
