"""Staff admin: read-only books, the payout timeline, and the RAIL_AMBIGUOUS quarantine.

One module per section: `books` (accounts, payouts, ledger), `quarantine` (the resolve page
and action), `recoveries` (record and close), `findings` (the reconciler's), `operators`
(reversals and refusals, view-only); `base` holds what they share (the UTC display, declared
permissions, the payout's evidence). Nothing here writes
a row directly: the quarantine's resolve goes through `payments.resolve.resolve_payout`, the
recoveries' record and close through `payments.recovery`, guarded by the reconciler's
evidence. Every time is shown to the millisecond, in UTC. payments imports no app above it:
apps that add evidence to a payout's page (railproxy/admin.py: the rail submission attempts)
register a provider with `register_evidence`.
"""

from payments.admin import books, findings, operators, quarantine, recoveries
from payments.admin.base import (
    EVIDENCE_PROVIDERS,
    DeclaredPermissions,
    ReadOnlyAdmin,
    ReadOnlyInline,
    payout_evidence,
    register_evidence,
    resolved_by,
    utc,
    utc_column,
)

__all__ = [
    "EVIDENCE_PROVIDERS",
    "DeclaredPermissions",
    "ReadOnlyAdmin",
    "ReadOnlyInline",
    "books",
    "findings",
    "operators",
    "payout_evidence",
    "quarantine",
    "recoveries",
    "register_evidence",
    "resolved_by",
    "utc",
    "utc_column",
]
