"""paydb tables of the rail proxy: the durable high-water mark and the submission records.

Both live in paydb (not in process memory, not in a cache) so that a restarted proxy or a second
proxy process rejects a stale token exactly as the first would (C3 §3.5).
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now


class Outcome(models.TextChoices):
    PENDING = "PENDING"  # intent committed, outcome not yet recorded (in flight or crashed)
    ACKED = "ACKED"
    TIMEOUT = "TIMEOUT"  # forwarded, no valid answer: timeout, reset, malformed ack, 5xx
    DECLINED = "DECLINED"  # the rail answered 402
    NOT_SENT = "NOT_SENT"  # connect refused / connect timeout: nothing was presented
    FENCED = "FENCED"  # refused at admission; never forwarded


# Rows that count as "the payout's submission" (admission step 2); at most one per payout.
LIVE_OUTCOMES = ("PENDING", "ACKED", "TIMEOUT", "DECLINED")


class RailHighWater(models.Model):
    """Per account: the highest token ever admitted to the rail (strict `>` to advance)."""

    account_id = models.CharField(primary_key=True, max_length=64)
    highest_token = models.BigIntegerField()
    # Set only when the attempt that holds `highest_token` ended NOT_SENT: that payout may be
    # presented again with the same token (the equality arm of admission step 1).
    retry_payout_id = models.UUIDField(null=True, blank=True)
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "rail_high_water"
        constraints = [
            models.CheckConstraint(
                condition=Q(highest_token__gte=0), name="rail_high_water_token_non_negative"
            )
        ]

    def __str__(self) -> str:
        return f"{self.account_id} ≥ {self.highest_token}"


class RailSubmission(models.Model):
    """One admission decision: an intent (then its outcome) or a fenced refusal."""

    submission_id = models.UUIDField(primary_key=True)
    payout_id = models.UUIDField()
    account_id = models.CharField(max_length=64)
    amount_minor = models.BigIntegerField()
    currency = models.CharField(max_length=3)
    presented_token = models.BigIntegerField()
    # FENCED rows: the stored value that beat the presented token.
    highest_token = models.BigIntegerField(null=True, blank=True)
    owner_id = models.CharField(max_length=64)
    idempotency_key = models.CharField(max_length=128)
    request_hash = models.CharField(max_length=64)
    # What was sent to the rail as clientRef: the payout id, so the rail's statement maps to a
    # payout without this table (and every booking for one payout shares one clientRef).
    client_ref = models.CharField(max_length=64)
    outcome = models.CharField(max_length=10, choices=Outcome.choices)
    rail_reference = models.CharField(max_length=128, null=True, blank=True)  # noqa: DJ001
    # Why an outcome is what it is: read_timeout, connection_reset, malformed_ack, http_500,
    # connect_refused, sweep, fenced_high_water, fenced_claim ...
    detail = models.CharField(max_length=64, null=True, blank=True)  # noqa: DJ001
    submitted_at = models.DateTimeField(db_default=Now())
    resolved_at = models.DateTimeField(null=True, blank=True)
    response_status = models.SmallIntegerField(null=True, blank=True)
    # The JSON answer exactly as sent (text, not jsonb: jsonb reorders keys), so a replay is
    # byte-identical, the original traceId included (CHANGELOG row 11).
    response_body = models.TextField(null=True, blank=True)  # noqa: DJ001

    class Meta:
        db_table = "rail_submission"
        constraints = [
            models.CheckConstraint(
                condition=Q(outcome__in=[o.value for o in Outcome]),
                name="rail_submission_outcome_valid",
            ),
            models.CheckConstraint(
                condition=Q(presented_token__gt=0), name="rail_submission_token_positive"
            ),
            # FR-18 backstop: one live submission per payout, whatever the token.
            models.UniqueConstraint(
                fields=["payout_id"],
                condition=Q(outcome__in=LIVE_OUTCOMES),
                name="rail_submission_one_live_per_payout",
            ),
        ]
        indexes = [
            models.Index(fields=["payout_id", "submitted_at"], name="rail_submission_payout_idx"),
            models.Index(
                fields=["idempotency_key", "presented_token"], name="rail_submission_idem_idx"
            ),
            models.Index(
                fields=["submitted_at"],
                condition=Q(outcome="PENDING"),
                name="rail_submission_pending_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.submission_id} {self.payout_id} @{self.presented_token} {self.outcome}"
