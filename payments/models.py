"""paydb: accounts, payouts, their transition history, the double-entry ledger, idempotency.

The database carries every invariant it can express (CHECK / UNIQUE); the conditional,
fenced writes live in `payments/fenced_sql.py`, never in `save()`.
"""

from __future__ import annotations

import uuid

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now


class PayoutState(models.TextChoices):
    PENDING = "PENDING"
    CLAIMED = "CLAIMED"
    SUBMITTING = "SUBMITTING"
    RAIL_ACKED = "RAIL_ACKED"
    POSTED = "POSTED"
    FAILED = "FAILED"
    ABANDONED = "ABANDONED"
    RAIL_AMBIGUOUS = "RAIL_AMBIGUOUS"


# The one definition of each set of payout states (ARCHITECTURE §3), as plain strings: payments
# and the rail proxy import these, and SQL binds them as parameters instead of spelling them out.
ALL_STATES: tuple[str, ...] = tuple(s.value for s in PayoutState)
# Payouts whose amount is committed but not yet debited (ARCHITECTURE §4 "available balance").
RESERVING_STATES: tuple[str, ...] = ("CLAIMED", "SUBMITTING", "RAIL_ACKED", "RAIL_AMBIGUOUS")
TERMINAL_STATES: tuple[str, ...] = ("POSTED", "FAILED", "ABANDONED")
# No automated (token-bearing) transition leaves these (ARCHITECTURE §3).
QUARANTINED_OR_TERMINAL: frozenset[str] = frozenset({"RAIL_AMBIGUOUS", *TERMINAL_STATES})
# P2 `expectedState`: a fresh claim, or a recovery re-claim of a CLAIMED payout.
CLAIMABLE_STATES: tuple[str, ...] = ("PENDING", "CLAIMED")
# Where an operator may resolve a RAIL_AMBIGUOUS payout to.
RESOLUTION_STATES: tuple[str, ...] = ("POSTED", "FAILED")

if not {*RESERVING_STATES, *QUARANTINED_OR_TERMINAL, *CLAIMABLE_STATES} <= set(ALL_STATES):
    raise RuntimeError("a payout state set names a state PayoutState lacks")  # pragma: no cover


class AccountKind(models.TextChoices):
    CUSTOMER = "CUSTOMER"
    SETTLEMENT = "SETTLEMENT"
    FUNDING = "FUNDING"
    # A receivable: money the rail paid out that no payout accounts for (rail recoveries).
    RECOVERABLE = "RECOVERABLE"
    # Money written off: a rail recovery closed WRITTEN_OFF.
    LOSS = "LOSS"


class Direction(models.TextChoices):
    DEBIT = "DEBIT"
    CREDIT = "CREDIT"


def _in(field: str, choices: type[models.TextChoices]) -> Q:
    return Q(**{f"{field}__in": [c.value for c in choices]})


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
            models.CheckConstraint(condition=_in("kind", AccountKind), name="account_kind_valid"),
            models.CheckConstraint(condition=Q(fence__gte=0), name="account_fence_non_negative"),
            models.CheckConstraint(
                condition=Q(currency__regex=r"^[A-Z]{3}$"), name="account_currency_iso4217"
            ),
        ]

    def __str__(self) -> str:
        return self.account_id


class SettlementBucket(models.Model):
    """One of the rows P3 spreads a settlement account's credits over (issue 28 item 3): a post
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
            models.CheckConstraint(condition=Q(amount_minor__gt=0), name="payout_amount_positive"),
            models.CheckConstraint(condition=_in("state", PayoutState), name="payout_state_valid"),
            models.CheckConstraint(
                condition=Q(attempt_count__gte=0), name="payout_attempt_count_non_negative"
            ),
            models.CheckConstraint(
                condition=Q(claim_token__isnull=True) | Q(claim_token__gt=0),
                name="payout_claim_token_positive",
            ),
            models.CheckConstraint(
                condition=Q(currency__regex=r"^[A-Z]{3}$"), name="payout_currency_iso4217"
            ),
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
            models.CheckConstraint(
                condition=_in("to_state", PayoutState), name="payout_event_to_state_valid"
            ),
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
            models.CheckConstraint(
                condition=Q(amount_minor__gt=0), name="ledger_entry_amount_positive"
            ),
            models.CheckConstraint(
                condition=_in("direction", Direction), name="ledger_entry_direction_valid"
            ),
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
            models.CheckConstraint(
                condition=_in("classification", ReconClassification),
                name="payout_reconciliation_classification_valid",
            ),
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
            models.CheckConstraint(condition=~Q(reason=""), name="fence_repair_reason_given"),
        ]

    def __str__(self) -> str:
        return f"{self.account_id}: {self.old_fence} → {self.new_fence} by {self.operator}"


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
            models.CheckConstraint(
                condition=Q(amount_minor__gt=0), name="rail_recovery_amount_positive"
            ),
            models.CheckConstraint(
                condition=_in("status", RecoveryStatus), name="rail_recovery_status_valid"
            ),
            models.CheckConstraint(condition=~Q(reason=""), name="rail_recovery_reason_given"),
            models.CheckConstraint(
                condition=Q(currency__regex=r"^[A-Z]{3}$"), name="rail_recovery_currency_iso4217"
            ),
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
            models.CheckConstraint(
                condition=Q(amount_minor__gt=0), name="payout_reversal_amount_positive"
            ),
            models.CheckConstraint(condition=~Q(reason=""), name="payout_reversal_reason_given"),
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
