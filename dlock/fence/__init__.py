"""dlock's fence kit: protect your own service's writes with dlock's fencing tokens.

The public API (docs/fence-kit.md "Protect your own service"); every name below is stable and
documented, everything else under `dlock.fence` is internal. The parts that need no Django
import without Django settings (`dlock.fence.django` is the Django glue and is imported on its
own).

Verify what a caller presents (headers in, token out, or InvalidToken):
    verifier = Verifier(PublicKeys.parse(os.environ["DLOCK_FENCING_PUBLIC_KEYS"]))
    token = verified_token(request_headers, key=f"stock:{sku}", verifier=verifier)

Write your row only if the token is the newest it has seen (else FencedOut):
    fenced_update(cursor, table="stock", where={"sku": sku}, set={...}, token=token,
                  owner_id=owner, resource_type="stock", resource_id=sku)

Call a third party at most once per operation, fenced (SideEffectGate.run).

Every FencedOut the kit raises counts `lock_fenced_out_total{resource}` on `fenced_out_counter`
(a prometheus_client Counter in no registry: register it with yours to export it).
"""

from __future__ import annotations

from dlock.fence.gate import (
    Ambiguous,
    Declined,
    DuplicateOperation,
    Intent,
    NotSent,
    SideEffectGate,
    Superseded,
)
from dlock.fence.marks import GATE_SCHEMA_SQL, HighWaterMark, IntentLog
from dlock.fence.proofs import (
    HEADER,
    TOKEN_HEADER,
    InvalidToken,
    KeyFormatError,
    PublicKeys,
    SigningKeys,
    Verifier,
    fetch_public_keys,
    verified_token,
)
from dlock.fence.refusals import FencedOut, fenced_out
from dlock.fence.sql import NEWER, SAME_GRANT, fence_predicate, fenced_update
from dlock.metrics import lock_fenced_out as fenced_out_counter

PROOF_HEADER = HEADER

__all__ = [
    "GATE_SCHEMA_SQL",
    "NEWER",
    "PROOF_HEADER",
    "SAME_GRANT",
    "TOKEN_HEADER",
    "Ambiguous",
    "Declined",
    "DuplicateOperation",
    "FencedOut",
    "HighWaterMark",
    "Intent",
    "IntentLog",
    "InvalidToken",
    "KeyFormatError",
    "NotSent",
    "PublicKeys",
    "SideEffectGate",
    "SigningKeys",
    "Superseded",
    "Verifier",
    "fence_predicate",
    "fenced_out",
    "fenced_out_counter",
    "fenced_update",
    "fetch_public_keys",
    "verified_token",
]
