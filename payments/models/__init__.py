"""paydb: accounts, payouts, their transition history, the double-entry ledger, idempotency,
and what the reconciler and operators record.

One module per aggregate: `states` (the payout states and their sets, kinds, directions),
`books` (accounts, settlement buckets, payouts and their events, ledger entries, idempotency
records), `reconciliation` (the reconciler's findings and runs, the quarantine), `recoveries`
(rail recoveries), `operators` (fence repairs, payout reversals, refusals). Import from
`payments.models`. The database carries every invariant it can express (CHECK / UNIQUE); the
conditional, fenced writes live in `payments/fenced_sql/`, never in `save()`.
"""

from payments.models.books import (
    Account,
    IdempotencyRecord,
    LedgerEntry,
    Payout,
    PayoutEvent,
    SettlementBucket,
)
from payments.models.operators import (
    FenceRepair,
    OperatorRefusal,
    PayoutReversal,
)
from payments.models.reconciliation import (
    PayoutReconciliation,
    QuarantinedPayout,
    ReconcileRun,
    ReconClassification,
)
from payments.models.recoveries import (
    RailRecovery,
    RailRecoveryEvent,
    RecoveryStatus,
)
from payments.models.states import (
    ALL_STATES,
    CLAIMABLE_STATES,
    QUARANTINED_OR_TERMINAL,
    RESERVING_STATES,
    RESOLUTION_STATES,
    TERMINAL_STATES,
    AccountKind,
    Direction,
    PayoutState,
    choices_in,
)

__all__ = [
    "ALL_STATES",
    "Account",
    "AccountKind",
    "CLAIMABLE_STATES",
    "Direction",
    "FenceRepair",
    "IdempotencyRecord",
    "LedgerEntry",
    "OperatorRefusal",
    "Payout",
    "PayoutEvent",
    "PayoutReconciliation",
    "PayoutReversal",
    "PayoutState",
    "QUARANTINED_OR_TERMINAL",
    "QuarantinedPayout",
    "RESERVING_STATES",
    "RESOLUTION_STATES",
    "RailRecovery",
    "RailRecoveryEvent",
    "ReconClassification",
    "ReconcileRun",
    "RecoveryStatus",
    "SettlementBucket",
    "TERMINAL_STATES",
    "choices_in",
]
