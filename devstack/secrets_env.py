"""Which process gets which secret (docs/security.md "Secrets, where they live").

`make up` starts every role with `role_environment(role, env)` and writes `stack_file_env(env)`
into `.run/stack.env`; the Kubernetes manifests follow the same table.
"""

from __future__ import annotations

import os

# Each secret reaches only the roles that use it (docs/security.md "Secrets"), as in k8s: the
# fencing proofs' private keys sign (the lock server alone; the payment resource and the rail
# proxy verify with DLOCK_FENCING_PUBLIC_KEYS, which is no secret); the credential
# hashes are checked by every role but the rail stub, which stands in for a third party and
# verifies no bearer. The plaintext credentials are the callers' (executor, operator): no
# server gets them. DJANGO_SECRET_KEY: every Django process (settings refuse to start without).
SECRET_USERS: dict[str, frozenset[str]] = {
    "DLOCK_PROOF_KEYS": frozenset({"lockserver"}),
    "DLOCK_CREDENTIALS": frozenset({"lockserver", "payments", "railproxy"}),
    "DLOCK_EXECUTOR_CREDENTIAL": frozenset({"executor", "ops"}),
    "DLOCK_OPERATOR_CREDENTIAL": frozenset({"ops"}),
    # A database URL carries its credentials: each server gets only its own database's (the
    # rail stub raildb, the payment resource and the rail proxy paydb, the lock server lockdb);
    # the admin pages read paydb; ops commands (migrate, reconcile, ...) all three.
    "LOCK_DATABASE_URL": frozenset({"lockserver", "ops"}),
    "PAY_DATABASE_URL": frozenset({"payments", "railproxy", "admin", "ops"}),
    "RAIL_DATABASE_URL": frozenset({"railstub", "ops"}),
    # etcd's client identity (make up TLS=1 LOCK_BACKEND=etcd): the lock server's alone
    "DLOCK_CLIENT_CERT": frozenset({"lockserver", "ops"}),
    "DLOCK_CLIENT_KEY": frozenset({"lockserver", "ops"}),
}
# `.run/stack.env` is what executors, ops commands and scripts source: the callers' credentials,
# URLs and database URLs, never the private keys (any holder could mint any proof) nor the
# hash list (a server's, rotated with the roles).
STACK_FILE_OMITS = ("DLOCK_PROOF_KEYS", "DLOCK_CREDENTIALS")


def role_environment(
    role: str, env: dict[str, str], *, base: dict[str, str] | None = None
) -> dict[str, str]:
    """The whole environment a `role` process starts with: `base` (default: this process's
    environment, which may hold a sourced stack.env or a ring exported by hand) without any
    secret, then `env` with only the secrets `role` uses."""
    inherited = dict(os.environ if base is None else base)
    merged = {k: v for k, v in inherited.items() if k not in SECRET_USERS} | env
    return {k: v for k, v in merged.items() if k not in SECRET_USERS or role in SECRET_USERS[k]}


def stack_file_env(env: dict[str, str]) -> dict[str, str]:
    """What `.run/stack.env` (and each role record's copy of the stack's env) may hold."""
    return {k: v for k, v in env.items() if k not in STACK_FILE_OMITS}
