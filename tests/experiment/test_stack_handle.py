"""The experiment's handle on the stack `make up` started restarts its PostgreSQL as it was
made: with TLS under `make up TLS=1` (a restart without it took the stack's databases down:
every role's verify-full URL was refused by a cluster that no longer spoke TLS)."""

from __future__ import annotations

from pathlib import Path

from experiment.stack import from_stack_env


def stack_env(run: Path, **values: str) -> Path:
    lines = [f"DLOCK_PG_DATADIR={run / 'pg'}", "DLOCK_PG_PORT=25432"]
    lines += [f"{name}={value}" for name, value in values.items()]
    (run / "stack.env").write_text("\n".join(lines) + "\n")
    return run


def test_a_tls_stacks_cluster_is_handled_with_its_tls(tmp_path):
    handle = from_stack_env(stack_env(tmp_path, DLOCK_TLS="1"))
    assert handle.pg_cluster is not None and handle.pg_cluster.tls is not None
    assert handle.pg_cluster.tls.ca == tmp_path / "tls" / "ca.crt"
    assert "sslmode=verify-full" in handle.pg_cluster.url("paydb")


def test_a_plain_stacks_cluster_is_handled_without_tls(tmp_path):
    handle = from_stack_env(stack_env(tmp_path))
    assert handle.pg_cluster is not None and handle.pg_cluster.tls is None
