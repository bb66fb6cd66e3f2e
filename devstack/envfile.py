"""`.run/stack.env`: the `KEY=value` file every script, test and README step reads.

Each value is written shell-quoted (shlex.quote), so `set -a; . .run/stack.env; set +a` in bash
gives every variable exactly the value the Python reader (`read_env`) gives it, whatever it
holds: the `&` and `?` of a TLS database URL, spaces, quotes.
"""

from __future__ import annotations

import os
import secrets
import shlex
import time
from pathlib import Path

from devstack.common import PROJECT
from dlock.fence.proofs import SigningKeys, new_signing_key


def run_dir(path: Path | str | None = None) -> Path:
    """The stack's run directory: `path`, else $DLOCK_RUN_DIR, else `.run/` in the checkout."""
    return Path(path or os.environ.get("DLOCK_RUN_DIR") or PROJECT / ".run")


def read_env(path: Path) -> dict[str, str]:
    """The file's variables as bash sourcing it sets them (a file from before the quoting,
    with bare values, reads as it always did)."""
    values: dict[str, str] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if "=" in line and not line.startswith("#"):
                key, raw = line.split("=", 1)
                try:
                    values[key] = " ".join(shlex.split(raw))
                except ValueError:  # an unbalanced quote in a bare value: the text as it is
                    values[key] = raw
    return values


def write_env(path: Path, env: dict[str, str]) -> None:
    """Sorted lines, the secret key last; written whole (rename) so a reader never sees half."""
    lines = [
        f"{key}={shlex.quote(value)}"
        for key, value in sorted(env.items())
        if key != "DJANGO_SECRET_KEY"
    ]
    if "DJANGO_SECRET_KEY" in env:
        lines.append(f"DJANGO_SECRET_KEY={shlex.quote(env['DJANGO_SECRET_KEY'])}")
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.chmod(0o600)
    tmp.replace(path)


def new_proof_keys() -> str:
    """A fresh DLOCK_PROOF_KEYS value: one Ed25519 signing key, named by the day it was made."""
    return new_signing_key(f"k{time.strftime('%Y%m%d', time.gmtime())}")


def public_keys_of(proof_keys_value: str) -> str:
    """The DLOCK_FENCING_PUBLIC_KEYS value (what verifiers get) for a DLOCK_PROOF_KEYS value."""
    return SigningKeys.parse(proof_keys_value).public().setting_value()


def proof_keys(run: Path) -> str:
    """The stack's fencing-proof private keys (`.run/proof_keys`), made once like the secret key;
    an operator may edit the file to rotate (docs/operations.md), then restart the roles."""
    path = run / "proof_keys"
    if not path.exists():
        path.write_text(new_proof_keys())
        path.chmod(0o600)
    return path.read_text().strip()


def secret_key(run: Path) -> str:
    path = run / "secret_key"
    if not path.exists():
        path.write_text(secrets.token_urlsafe(48))
        path.chmod(0o600)
    return path.read_text().strip()
