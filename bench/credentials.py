"""What a bench's own servers and clients need since issue 15 and decision 15: caller
credentials (`Authorization: Bearer …`) and a fencing-proof key ring.

`server_env()` is laid into every bench server's environment: `DLOCK_CREDENTIALS` (the hashes of
this process's executor and operator credentials, made here when the environment has none) and
`DLOCK_PROOF_KEYS` (this process's, else a fresh ring). `headers()` is what a bench client sends:
the executor credential, plus `X-Fencing-Token` and `X-Fencing-Proof` when it holds a grant.
"""

from __future__ import annotations

import os

from devstack.envfile import new_proof_keys
from dlock.auth import CREDENTIAL_ENV, authorization_header, credentials_entry, new_credential

PROOF_KEYS_ENV = "DLOCK_PROOF_KEYS"
PROOF_HEADER = "X-Fencing-Proof"


def _ensure() -> dict[str, str]:
    for var in CREDENTIAL_ENV.values():
        os.environ.setdefault(var, new_credential())
    os.environ.setdefault(PROOF_KEYS_ENV, new_proof_keys())
    return {
        "DLOCK_CREDENTIALS": ",".join(
            credentials_entry(os.environ[var], scope) for scope, var in CREDENTIAL_ENV.items()
        ),
        PROOF_KEYS_ENV: os.environ[PROOF_KEYS_ENV],
        **{var: os.environ[var] for var in CREDENTIAL_ENV.values()},
    }


def server_env() -> dict[str, str]:
    """Credentials' hashes and the proof key ring for a server this bench starts."""
    return _ensure()


def headers(grant: dict | None = None, scope: str = "executor") -> dict[str, str]:
    """`Authorization` for `scope`; with a grant (an L4/L5 answer), its token and proof too."""
    _ensure()
    out = authorization_header(scope)
    if grant is not None:
        out["X-Fencing-Token"] = str(grant["fencingToken"])
        out[PROOF_HEADER] = grant["fencingProof"]  # decision 15: L4/L5 answer it with the token
    return out
