"""The stack the experiment drives: URLs, database URLs, and how to restart each piece.

Two sources: `.run/stack.env` (what `make up` started; roles restarted through `.run/pids`), or
a stack a test started in-process (`tests.conftest.start_stack`), which hands its own restart
callables in. The experiment never assumes which.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import requests

from devstack.common import PROJECT, PYTHON, URL_ENV, ready, wait_until
from devstack.envfile import new_proof_keys, read_env
from devstack.postgres import PgCluster
from devstack.roles import RoleProcess
from devstack.stack import restart_role
from devstack.tls import stack_tls

ROLES = ("lockserver", "payments", "railproxy", "railstub")


class MissingPiece(RuntimeError):
    """A part of the system the experiment needs is not there (not built, not running)."""


@dataclass
class StackHandle:
    env: dict[str, str]
    restart_role: Callable[..., None]  # (role); a private stack's also takes env= overrides
    pg_cluster: PgCluster | None = None
    run_dir: Path = field(default_factory=lambda: PROJECT / ".run")

    def url(self, role: str) -> str:
        """The role's first URL (an HA stack lists every replica, comma-separated)."""
        return self.urls(role)[0]

    def urls(self, role: str) -> list[str]:
        return [u.strip().rstrip("/") for u in self.env[URL_ENV[role]].split(",") if u.strip()]

    def restart_pg(self) -> None:
        if self.pg_cluster is None:
            raise MissingPiece("this stack's PostgreSQL is not ours to restart")
        self.pg_cluster.stop("fast")
        time.sleep(0.5)
        self.pg_cluster.start()

    def manage(
        self, *args: str, role: str = "ops", timeout: float = 120
    ) -> subprocess.CompletedProcess:
        return subprocess.run(
            [PYTHON, str(PROJECT / "manage.py"), *args],
            cwd=PROJECT,
            env={**os.environ, **self.env, "ROLE": role},
            text=True,
            capture_output=True,
            timeout=timeout,
            check=False,
        )

    def check_ready(self) -> None:
        down = [f"{role} ({url})" for role in ROLES for url in self.urls(role) if not ready(url)]
        if down:
            raise MissingPiece("not ready: " + ", ".join(down) + " — run `make up`")

    def wait_ready(self, timeout: float = 60) -> None:
        for role in ROLES:
            for url in self.urls(role):
                wait_until(lambda u=url: ready(u), timeout=timeout, what=f"{role} {url} ready")


def from_stack_env(run_dir: Path | None = None) -> StackHandle:
    """The stack `make up` started (`.run/stack.env`, pids under `.run/pids`)."""
    run_dir = Path(run_dir or os.environ.get("DLOCK_RUN_DIR", PROJECT / ".run"))
    env = read_env(run_dir / "stack.env")
    if not env:
        raise MissingPiece(f"no {run_dir / 'stack.env'}: run `make up` first")
    for var in ("DLOCK_EXECUTOR_CREDENTIAL", "DLOCK_OPERATOR_CREDENTIAL"):  # issue 15
        if env.get(var):
            os.environ.setdefault(var, env[var])  # the runner's in-process lock client

    def restart(role: str) -> None:
        # exactly the argv and environment the role was started with (its .run/roles record)
        restart_role(role, run=run_dir)

    cluster = None
    if env.get("DLOCK_PG_DATADIR"):  # as `make up` made it: TLS only under TLS=1
        cluster = PgCluster(
            Path(env["DLOCK_PG_DATADIR"]),
            int(env["DLOCK_PG_PORT"]),
            tls=stack_tls(run_dir, env),
        )
    return StackHandle(env=env, restart_role=restart, pg_cluster=cluster, run_dir=run_dir)


def scrape(url: str, timeout: float = 1.0) -> str | None:
    try:
        resp = requests.get(f"{url}/metrics", timeout=timeout)
    except requests.RequestException:
        return None
    return resp.text if resp.status_code == 200 else None


def _credentials() -> dict[str, str]:
    """An executor and an operator credential (this process's, else fresh ones, which this
    process then uses too: the runner calls the lock server in-process), and their hashes."""
    from dlock.auth import credentials_entry, new_credential

    executor = os.environ.setdefault("DLOCK_EXECUTOR_CREDENTIAL", new_credential())
    operator = os.environ.setdefault("DLOCK_OPERATOR_CREDENTIAL", new_credential())
    return {
        "DLOCK_EXECUTOR_CREDENTIAL": executor,
        "DLOCK_OPERATOR_CREDENTIAL": operator,
        "DLOCK_CREDENTIALS": (
            f"{credentials_entry(executor, 'executor')},{credentials_entry(operator, 'operator')}"
        ),
    }


__all__ = ["MissingPiece", "StackHandle", "from_stack_env", "scrape"]


def private_stack(
    run_dir: Path,
    *,
    fast: bool = True,
    extra_env: dict[str, str] | None = None,
    pg_settings: tuple[str, ...] = (),
) -> tuple[StackHandle, Callable[[], None]]:
    """A stack of our own: a PostgreSQL cluster and the four roles on free ports under run_dir.

    For tests (fast=True: fsync off) and benchmarks (fast=False: durable). Returns the handle and
    a stop function. The experiment restarts this cluster too, so it is never the suite's own.
    `pg_settings`: more `name=value` settings for the cluster (the bench's pg_stat_statements).
    """
    import secrets
    import shutil

    from devstack.common import DATABASES, DB_URL_ENV, free_port
    from devstack.postgres import private_datadir
    from devstack.roles import migrate_all, stop_all

    run_dir.mkdir(parents=True, exist_ok=True)
    # As root the cluster runs as `postgres`, which must reach its datadir (under /tmp then).
    datadir = private_datadir(run_dir, "pg")
    shutil.rmtree(datadir, ignore_errors=True)  # a throwaway stack starts from nothing
    datadir.parent.mkdir(parents=True, exist_ok=True)
    datadir.parent.chmod(0o755)
    cluster = PgCluster(datadir, free_port(), fast=fast, settings=pg_settings)
    cluster.start()
    env = {
        "DJANGO_SECRET_KEY": secrets.token_urlsafe(48),
        "DLOCK_PROOF_KEYS": new_proof_keys(),
        "DJANGO_DEBUG": "false",
        "LOCK_BACKEND": "pg",
        "DJANGO_ALLOWED_HOSTS": "127.0.0.1,localhost",
        **{DB_URL_ENV[name]: cluster.create_database(name) for name in DATABASES},
        **_credentials(),  # issue 15: callers and roles of this throwaway stack
        **(extra_env or {}),
    }
    ports = {role: free_port() for role in ROLES}
    env.update({URL_ENV[role]: f"http://127.0.0.1:{port}" for role, port in ports.items()})
    procs: dict[str, RoleProcess] = {}

    def stop() -> None:
        stop_all(procs.values())
        cluster.stop("immediate")
        shutil.rmtree(datadir, ignore_errors=True)

    try:
        migrate_all(env)
        for role, port in ports.items():
            procs[role] = RoleProcess(role, port, env, run_dir / "logs" / f"{role}.log")
            procs[role].start(wait=False)
        for proc in procs.values():
            proc.wait_ready()
    except Exception:
        stop()
        raise

    def restart(role: str, env: dict[str, str] | None = None) -> None:
        """`env`: settings laid over the role's environment from this start on (a bench arm,
        e.g. PAY_SETTLEMENT_BUCKETS); the other roles and `manage` keep the stack's."""
        procs[role].stop()
        if env:
            procs[role].env = {**procs[role].env, **env}
        procs[role].start()

    return StackHandle(env=env, restart_role=restart, pg_cluster=cluster, run_dir=run_dir), stop
