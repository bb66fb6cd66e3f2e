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

# What a role takes from the caller's shell: the system basics and dlock's own settings (the
# prefixes of every variable settings/, gunicorn and devstack read), nothing else. A cloud
# token, an SSH agent or a password exported in the caller's shell never reaches a role (nor
# the role's record under .run/roles/).
CALLER_NAMES = frozenset(
    {"PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TERM"}
    | {"PORT", "BIND_HOST", "METRICS_PORT", "PROMETHEUS_MULTIPROC_DIR", "ADMIN_URL", "PAYMENTS_URL"}
)
CALLER_PREFIXES = (
    "LC_",
    "DJANGO_",
    "DLOCK_",
    "DB_",
    "LOCK_",
    "PAY_",
    "RAIL_",
    "ETCD_",
    "SERVER_",
    "GUNICORN_",
    "PROXY_",
    "EXECUTOR_",
    "IDEMPOTENCY_",
)


def caller_environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The allow-listed part of `environ` (default: this process's environment)."""
    source = os.environ if environ is None else environ
    return {k: v for k, v in source.items() if k in CALLER_NAMES or k.startswith(CALLER_PREFIXES)}


def role_environment(
    role: str, env: dict[str, str], *, base: dict[str, str] | None = None
) -> dict[str, str]:
    """The whole environment a `role` process starts with: the allow-listed part of `base`
    (default: this process's environment, which may hold a sourced stack.env or a ring exported
    by hand; `caller_environment`) without any secret, then `env` with only the secrets `role`
    uses."""
    inherited = caller_environment(dict(os.environ if base is None else base))
    merged = {k: v for k, v in inherited.items() if k not in SECRET_USERS} | env
    return {k: v for k, v in merged.items() if k not in SECRET_USERS or role in SECRET_USERS[k]}


def stack_file_env(env: dict[str, str]) -> dict[str, str]:
    """What `.run/stack.env` (and each role record's copy of the stack's env) may hold."""
    return {k: v for k, v in env.items() if k not in STACK_FILE_OMITS}
