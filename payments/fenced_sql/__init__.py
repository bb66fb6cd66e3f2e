"""The fenced layer: every conditional write on paydb's account/payout/ledger rows.

Raw SQL because each decision is "did this one conditional UPDATE move a row?" — the ORM
cannot express `SET fence = :t WHERE fence < :t RETURNING …` as one statement, nor a
transition plus its history row as one round trip. The row count (or RETURNING row) decides;
the caller raises. Every function takes a Django cursor on `connections[alias_for("payments")]`
and must run inside the caller's `transaction.atomic(using=alias_for("payments"))`.

One module per resource, each a set of named functions over its SQL constants: `payout`
(transitions), `account` (fence push, row lock), `fences` (P2/P3's record-or-fence step and the
idempotency records), `claim` (P2), `post` (P3), `ledger` (double entry outside P3). Callers
use this package's names (`fenced_sql.post`, `fenced_sql.POST_SQL`).

Exported for other apps (docs/briefs/INTERFACES.md): `transition_payout`, `raise_account_fence`
(None for an unknown account; `payments.operator.push_fence_floor` raises NOT_FOUND).
"""

from __future__ import annotations

from payments.fenced_sql.account import (
    ACCOUNT_FOR_UPDATE_SQL,
    ENSURE_ACCOUNT_SQL,
    RAISE_ACCOUNT_FENCE_SQL,
    ensure_account,
    lock_account,
    raise_account_fence,
)
from payments.fenced_sql.claim import (
    CLAIM_CHECK_SQL,
    CLAIM_TRANSITION_SQL,
    FAIL_FOR_FUNDS_SQL,
    ClaimCheck,
    claim_check,
    claim_transition,
    fail_for_funds,
)
from payments.fenced_sql.fences import (
    CLAIM_RECORD_OR_FENCE_SQL,
    FENCE_DIAGNOSIS_SQL,
    IDEMPOTENCY_STORE_SQL,
    POST_RECORD_OR_FENCE_SQL,
    RECORD_MOVED_CTE,
    FencedAccount,
    FenceDiagnosis,
    RecordOrFence,
    fence_diagnosis,
    idempotency_store,
    record_or_fence,
)
from payments.fenced_sql.ledger import (
    POST_LEDGER_SQL,
    Posting,
    post_ledger,
)
from payments.fenced_sql.payout import (
    PAYOUT_LOCK_SQL,
    PAYOUT_STATE_SQL,
    TRANSITION_PAYOUT_SQL,
    payout_state,
    transition_payout,
)
from payments.fenced_sql.post import (
    POST_SQL,
    POST_TRANSITION_SQL,
    Posted,
    post,
    post_transition,
    settlement_bucket,
)
from payments.models import QUARANTINED_OR_TERMINAL, RESERVING_STATES

__all__ = [
    "ACCOUNT_FOR_UPDATE_SQL",
    "CLAIM_CHECK_SQL",
    "CLAIM_RECORD_OR_FENCE_SQL",
    "CLAIM_TRANSITION_SQL",
    "ClaimCheck",
    "ENSURE_ACCOUNT_SQL",
    "FAIL_FOR_FUNDS_SQL",
    "FENCE_DIAGNOSIS_SQL",
    "FenceDiagnosis",
    "FencedAccount",
    "IDEMPOTENCY_STORE_SQL",
    "PAYOUT_LOCK_SQL",
    "PAYOUT_STATE_SQL",
    "POST_LEDGER_SQL",
    "POST_RECORD_OR_FENCE_SQL",
    "POST_SQL",
    "POST_TRANSITION_SQL",
    "Posted",
    "Posting",
    "QUARANTINED_OR_TERMINAL",
    "RAISE_ACCOUNT_FENCE_SQL",
    "RECORD_MOVED_CTE",
    "RESERVING_STATES",
    "RecordOrFence",
    "TRANSITION_PAYOUT_SQL",
    "claim_check",
    "claim_transition",
    "ensure_account",
    "fail_for_funds",
    "fence_diagnosis",
    "idempotency_store",
    "lock_account",
    "payout_state",
    "post",
    "post_ledger",
    "post_transition",
    "raise_account_fence",
    "record_or_fence",
    "settlement_bucket",
    "transition_payout",
]
