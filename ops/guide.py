"""What the on-call does next about one reconciler finding: the payout's own transfer, the ones
that need a rail recovery (oldest first), and the exact commands (docs/books.md runbooks).

The payout's own transfer is the one its POSTED row names; for a quarantined payout, the oldest
booked transfer no recovery accounts for (the first the rail accepted: the later ones are the
duplicates). Commands are printed with YOUR_ADMIN_USER for `--operator`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ops.invariants import Payout

OPS = "ROLE=ops manage.py"
WHO = "--operator YOUR_ADMIN_USER"


def record(ref: str, payout_id: str) -> str:
    return (
        f'{OPS} record_rail_recovery --transfer {ref} --reason "duplicate of payout '
        f'{payout_id} on the rail statement" {WHO}'
    )


def guide(p: Payout) -> tuple[str | None, list[str], list[str]]:
    """(ownReference, needsRecovery, nextSteps) for one finding."""
    left = p.left
    pid = p.payout_id
    if p.state == "POSTED":
        if p.posted_ref not in p.refs:
            return (
                p.posted_ref,
                [],
                [
                    f"{OPS} rail_statement --client-ref {pid}",
                    f'{OPS} reverse_payout {pid} --reason "reference {p.posted_ref} is not on '
                    f'the rail statement" {WHO}',
                    f"{OPS} reconcile",
                ],
            )
        needs = [r for r in left if r != p.posted_ref]
        return p.posted_ref, needs, [record(r, pid) for r in needs]
    if p.state in ("FAILED", "ABANDONED"):
        return None, left, [record(r, pid) for r in left]
    if p.state == "SUBMITTING":
        return None, [], []  # still on the automated path: the executor or the sweep settles it
    # RAIL_AMBIGUOUS
    if p.classification == "NO_SUBMISSION":
        return None, [], [f"see docs/books.md, quarantine class NO_SUBMISSION ({pid})"]
    if not left:
        return (
            None,
            [],
            [f'{OPS} resolve_payout {pid} --to FAILED --note "not booked on the rail" {WHO}'],
        )
    own, needs = left[0], left[1:]
    return (
        own,
        needs,
        [
            *(record(r, pid) for r in needs),
            *([f"{OPS} reconcile"] if needs else []),
            f"{OPS} resolve_payout {pid} --to POSTED --reference {own} "
            f'--note "booked once on the rail statement" {WHO}',
        ],
    )
