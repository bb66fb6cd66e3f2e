"""The books: accounts (with their settlement buckets), payouts with their transition history,
the double-entry ledger and the idempotency records of P2/P3."""

from __future__ import annotations

import uuid

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from payments.models.states import (
    AccountKind,
    Direction,
    PayoutState,
    amount_positive,
    currency_iso4217,
    valid_choice,
)


class Account(models.Model):
    """A balance row and its fence: the highest fencing token that has written it."""

    account_id = models.CharField(primary_key=True, max_length=64)
    currency = models.CharField(max_length=3)
    kind = models.CharField(max_length=16, choices=AccountKind.choices, default="CUSTOMER")
    balance_minor = models.BigIntegerField(default=0, db_default=0)
    fence = models.BigIntegerField(default=0, db_default=0)
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "account"
        constraints = [
            models.CheckConstraint(
                condition=~Q(kind="CUSTOMER") | Q(balance_minor__gte=0),
                name="account_customer_balance_non_negative",
            ),
            valid_choice("account", "kind", AccountKind),
            models.CheckConstraint(condition=Q(fence__gte=0), name="account_fence_non_negative"),
            currency_iso4217("account"),
        ]

    def __str__(self) -> str:
        return self.account_id


class SettlementBucket(models.Model):
    """One of the rows P3 spreads a settlement account's credits over (CHANGELOG row 75): a post
    credits bucket `hash(payout id) mod PAY_SETTLEMENT_BUCKETS` of `settlement:<currency>`, so
    the posts of one currency lock one of N rows, not one row, until their commits' fsync.

    balance(settlement:<ccy>) = account.balance_minor + Σ its buckets' balance_minor
    (payments.selectors.balance_sql, the one way to read a balance); ledger entries still name
    the account. Written only by fenced_sql.POST_SQL; operator moves change the account row.
    """

    pk = models.CompositePrimaryKey("account_id", "bucket")
    account = models.ForeignKey(
        Account,
        on_delete=models.PROTECT,
        db_column="account_id",
        related_name="buckets",
        db_index=False,  # the primary key (account_id, bucket) leads with it
    )
    bucket = models.SmallIntegerField()
    balance_minor = models.BigIntegerField(default=0, db_default=0)
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "settlement_bucket"
        constraints = [
            models.CheckConstraint(
                condition=Q(bucket__gte=0), name="settlement_bucket_non_negative"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.account_id}#{self.bucket}"


class Payout(models.Model):
    payout_id = models.UUIDField(primary_key=True, default=uuid.uuid4)
    account = models.ForeignKey(
        Account, on_delete=models.PROTECT, db_column="account_id", related_name="payouts"
    )
    amount_minor = models.BigIntegerField()
    currency = models.CharField(max_length=3)
    beneficiary_ref = models.CharField(max_length=128)
    state = models.CharField(max_length=16, choices=PayoutState.choices, default="PENDING")
    attempt_count = models.IntegerField(default=0, db_default=0)
    claim_token = models.BigIntegerField(null=True, blank=True)
    claim_owner_id = models.CharField(max_length=64, null=True, blank=True)  # noqa: DJ001 - NULL = never set
    idempotency_key = models.CharField(max_length=128, unique=True)
    rail_reference = models.CharField(max_length=128, null=True, blank=True)  # noqa: DJ001 - NULL = never set
    rail_submission_id = models.UUIDField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "payout"
        constraints = [
            amount_positive("payout"),
            valid_choice("payout", "state", PayoutState),
            models.CheckConstraint(
                condition=Q(attempt_count__gte=0), name="payout_attempt_count_non_negative"
            ),
            models.CheckConstraint(
                condition=Q(claim_token__isnull=True) | Q(claim_token__gt=0),
                name="payout_claim_token_positive",
            ),
            currency_iso4217("payout"),
        ]
        indexes = [
            models.Index(fields=["created_at", "payout_id"], name="payout_page_idx"),
            models.Index(fields=["state", "created_at", "payout_id"], name="payout_state_page_idx"),
            models.Index(
                fields=["account", "state", "created_at", "payout_id"],
                name="payout_account_state_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.payout_id} ({self.state})"


class PayoutEvent(models.Model):
    """Append-only transition history; one row per state change, written in its transaction."""

    id = models.BigAutoField(primary_key=True)
    payout = models.ForeignKey(
        Payout, on_delete=models.PROTECT, db_column="payout_id", related_name="events"
    )
    from_state = models.CharField(max_length=16, null=True, blank=True)  # noqa: DJ001 - NULL = never set
    to_state = models.CharField(max_length=16)
    token = models.BigIntegerField(null=True, blank=True)
    owner_id = models.CharField(max_length=64)
    note = models.TextField(null=True, blank=True)  # noqa: DJ001 - NULL = never set
    at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "payout_event"
        ordering = ["at", "id"]
        constraints = [
            valid_choice("payout_event", "to_state", PayoutState),
        ]
        indexes = [models.Index(fields=["payout", "at"], name="payout_event_payout_idx")]

    def __str__(self) -> str:
        return f"{self.from_state or '∅'} → {self.to_state}"


class LedgerEntry(models.Model):
    """One leg of a double-entry posting; balance = Σ CREDIT − Σ DEBIT of an account's rows."""

    entry_id = models.UUIDField(primary_key=True, default=uuid.uuid4)
    payout = models.ForeignKey(
        Payout,
        on_delete=models.PROTECT,
        db_column="payout_id",
        null=True,
        blank=True,
        related_name="entries",
    )
    account = models.ForeignKey(
        Account, on_delete=models.PROTECT, db_column="account_id", related_name="entries"
    )
    direction = models.CharField(max_length=6, choices=Direction.choices)
    amount_minor = models.BigIntegerField()
    fence = models.BigIntegerField(default=0)
    posted_at = models.DateTimeField(db_default=Now())
    # Set on the legs of a rail recovery (recorded, recovered or written off); payout is NULL.
    recovery = models.ForeignKey(
        "RailRecovery",
        on_delete=models.PROTECT,
        db_column="recovery_id",
        null=True,
        blank=True,
        related_name="entries",
    )
    # Set on the legs of a payout reversal (payments/reversal.py); payout is NULL.
    reversal = models.ForeignKey(
        "PayoutReversal",
        on_delete=models.PROTECT,
        db_column="reversal_id",
        null=True,
        blank=True,
        related_name="entries",
    )

    class Meta:
        db_table = "ledger_entry"
        verbose_name_plural = "ledger entries"
        constraints = [
            amount_positive("ledger_entry"),
            valid_choice("ledger_entry", "direction", Direction),
            models.UniqueConstraint(
                fields=["payout", "direction"],
                condition=Q(payout__isnull=False),
                name="ledger_entry_one_leg_per_direction",
            ),
        ]
        indexes = [models.Index(fields=["account", "posted_at"], name="ledger_entry_account_idx")]

    def __str__(self) -> str:
        return f"{self.direction} {self.amount_minor} {self.account_id}"


class IdempotencyRecord(models.Model):
    """The stored answer to (operation, X-Idempotency-Key, token); written with the effect."""

    id = models.BigAutoField(primary_key=True)
    operation = models.CharField(max_length=16)
    idempotency_key = models.CharField(max_length=128)
    token = models.BigIntegerField()
    request_hash = models.CharField(max_length=64)
    payout_id = models.UUIDField(null=True, blank=True)
    status = models.SmallIntegerField()
    body = models.TextField()  # the JSON answer as sent, so a replay is byte-identical
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "idempotency_record"
        constraints = [
            models.UniqueConstraint(
                fields=["operation", "idempotency_key", "token"], name="idempotency_identity"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.operation} {self.idempotency_key} @{self.token}"
