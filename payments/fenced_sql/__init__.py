"""The fenced layer: every conditional write on paydb's account/payout/ledger rows.

Raw SQL because each decision is "did this one conditional UPDATE move a row?" — the ORM
cannot express `SET fence = :t WHERE fence < :t RETURNING …` as one statement, nor a
transition plus its history row as one round trip. The row count (or RETURNING row) decides;
the caller raises. Every function takes a Django cursor on `connections[alias_for("payments")]`
and must run inside the caller's `transaction.atomic(using=alias_for("payments"))`.

One module per resource, each a set of named functions over its SQL constants: `payout`
(transitions), `account` (fence push, row lock), `fences` (P2/P3's record-or-fence step, built
on the fence kit's predicate, and the idempotency records), `claim` (P2), `post` (P3),
`ledger` (double entry outside P3). Callers import each name from its module (no re-exports
here); other apps use `payout.transition_payout` and `account.raise_account_fence` (None for an
unknown account; `payments.operator.push_fence_floor` raises NOT_FOUND).
"""
