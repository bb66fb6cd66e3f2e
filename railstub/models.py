"""The rail's own books in raildb: its statement and its fault configuration.

The stub is a stand-in for a third party: nothing here knows about locks, tokens or payouts.
"""

from __future__ import annotations

from django.db import models


class RailTransfer(models.Model):
    """One booked transfer: money moved. This table is the rail's statement, the ground truth."""

    rail_reference = models.CharField(max_length=64, primary_key=True)
    client_ref = models.CharField(max_length=128, db_index=True)
    amount_minor = models.BigIntegerField()
    currency = models.CharField(max_length=3)
    accepted_at = models.DateTimeField()
    # Set on every booking after the first for the same clientRef (a repeat call or a duplicate
    # ack): the reference of that first booking.
    duplicate_of = models.CharField(max_length=64, null=True, blank=True)  # noqa: DJ001

    class Meta:
        db_table = "rail_transfer"
        ordering = ["accepted_at", "rail_reference"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(amount_minor__gt=0), name="rail_transfer_amount_positive"
            )
        ]

    def __str__(self) -> str:
        return f"{self.rail_reference} {self.client_ref} {self.amount_minor} {self.currency}"


class RailRequest(models.Model):
    """The stub's access log: every well-formed request it received and the fault it chose.

    Not a dedupe table (the stub never reads it to decide anything); it lets tests and humans
    prove that a call did or did not reach the rail.
    """

    id = models.BigAutoField(primary_key=True)
    client_ref = models.CharField(max_length=128, db_index=True)
    amount_minor = models.BigIntegerField()
    currency = models.CharField(max_length=3)
    received_at = models.DateTimeField()
    fault = models.CharField(max_length=32)
    rail_reference = models.CharField(max_length=64, null=True, blank=True)  # noqa: DJ001

    class Meta:
        db_table = "rail_request"

    def __str__(self) -> str:
        return f"{self.client_ref} {self.fault}"


class RailstubConfig(models.Model):
    """The single configuration row (id = 1), read on every request so it can change live.

    failure_rate is split between three faults by integer weights: a 5xx (nothing booked), a
    connection held open `hold_ms` then dropped before booking, and a connection dropped right
    after booking (money moved, the caller never learns). seed NULL = fresh randomness.
    """

    id = models.SmallIntegerField(primary_key=True, default=1)
    latency_ms = models.IntegerField(default=0)
    failure_rate = models.FloatField(default=0.0)
    duplicate_ack_rate = models.FloatField(default=0.0)
    decline_rate = models.FloatField(default=0.0)
    split_5xx = models.IntegerField(default=1)
    split_drop_before = models.IntegerField(default=1)
    split_drop_after = models.IntegerField(default=1)
    hold_ms = models.IntegerField(default=10_000)
    seed = models.BigIntegerField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "railstub_config"
        constraints = [
            models.CheckConstraint(condition=models.Q(id=1), name="railstub_config_single_row"),
            models.CheckConstraint(
                condition=models.Q(latency_ms__gte=0, latency_ms__lte=60_000),
                name="railstub_config_latency_range",
            ),
            models.CheckConstraint(
                condition=models.Q(hold_ms__gte=0, hold_ms__lte=60_000),
                name="railstub_config_hold_range",
            ),
            models.CheckConstraint(
                condition=models.Q(
                    failure_rate__gte=0,
                    failure_rate__lte=1,
                    duplicate_ack_rate__gte=0,
                    duplicate_ack_rate__lte=1,
                    decline_rate__gte=0,
                    decline_rate__lte=1,
                ),
                name="railstub_config_rates_are_fractions",
            ),
            models.CheckConstraint(
                condition=models.Q(
                    split_5xx__gte=0, split_drop_before__gte=0, split_drop_after__gte=0
                ),
                name="railstub_config_splits_non_negative",
            ),
        ]

    def __str__(self) -> str:
        return f"railstub config latency={self.latency_ms}ms failure={self.failure_rate}"
