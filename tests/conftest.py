"""Fixtures shared by the whole suite: the live stack (real processes on loopback)."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from devstack.common import DB_URL_ENV, URL_ENV, free_port
from devstack.etcd import EtcdServer
from devstack.postgres import PgCluster
from devstack.roles import RoleProcess, manage, stop_all
from devstack.secrets_env import role_environment
from devstack.tls import ensure_tls
from tests import credentials, pgplugin

ROLES = ("lockserver", "payments", "railproxy", "railstub")


@dataclass
class LiveStack:
    """Four roles under gunicorn against their own freshly migrated databases."""

    env: dict[str, str]
    logdir: Path
    procs: dict[str, RoleProcess] = field(default_factory=dict)

    def url(self, role: str) -> str:
        return self.procs[role].url

    def restart(self, role: str) -> None:
        self.procs[role].stop()
        self.procs[role].start()

    def manage(self, *args: str, check: bool = True, capture: bool = True):
        return manage(args, self.env, check=check, capture=capture)

    def start_admin(self) -> RoleProcess:
        """The admin role (ROLE=admin) behind its own nginx on this stack's paydb, started once,
        with the environment `make up` gives it: no proof ring, no credential (hashes or
        plaintexts), as in k8s/admin.yaml."""
        if "admin" not in self.procs:
            self.procs["admin"] = RoleProcess(
                "admin",
                free_port(),
                role_environment("admin", self.env),
                self.logdir / "admin.log",
                inherit_environ=False,
            ).start()
        return self.procs["admin"]


def create_live_databases(prefix: str, cluster: PgCluster | None = None) -> dict[str, str]:
    """One fresh database per database URL variable, on the suite's server or on `cluster`
    (tls_postgres: then every URL carries sslmode=verify-full and the cluster's CA)."""
    if cluster is not None:
        return {
            var: cluster.create_database(f"{prefix}_{name}", recreate=True)
            for name, var in DB_URL_ENV.items()
        }
    return {var: _create_db(f"{prefix}_{name}") for name, var in DB_URL_ENV.items()}


@pytest.fixture(scope="module")
def tls_postgres() -> Iterator[PgCluster]:
    """A PostgreSQL cluster of the module's own that speaks TLS only, as production's does:
    devstack.tls's CA and server certificate (127.0.0.1), pg_hba `hostssl` (a clear-text
    connection is refused), URLs with `sslmode=verify-full&sslrootcert=<its CA>` (the CA is
    readable by anyone: a container's user reads it through a read-only mount). On a reserved
    port (free_port); stopped and removed when the module ends. The production image refuses
    any other URL, so the image tests run against this, not the suite's own server."""
    parent = Path(tempfile.mkdtemp(prefix="dlock-test-tlspg-"))
    parent.chmod(0o755)  # as root the cluster runs as `postgres`, which must reach its datadir
    cluster = PgCluster(parent / "data", free_port(), fast=True, tls=ensure_tls(parent / "tls"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop("immediate")
        shutil.rmtree(parent, ignore_errors=True)


def migrated_live_databases(prefix: str) -> dict[str, str]:
    """create_live_databases, then migrate_all: each database as its role migrates it."""
    return {
        var: migrated_db(f"{prefix}_{name}", MIGRATED_BY[name], var)
        for name, var in DB_URL_ENV.items()
    }


# Who migrates each database (devstack.migrate_all): the role that holds every table in it.
MIGRATED_BY = {"lockdb": "lockserver", "paydb": "admin", "raildb": "railstub"}
# (role, database variable) -> a database that role migrated once in this test process
_MIGRATED: dict[tuple[str, str], str] = {}


def migrated_db(name: str, role: str, var: str) -> str:
    """A new database `name` holding what `manage.py migrate`, run as `role` on the database
    `var` names, makes of an empty one: a copy (CREATE DATABASE ... TEMPLATE) of one migrated
    once per test process, so a stack pays for its migrations once, not at every start."""
    template = _MIGRATED.get((role, var))
    if template is None:
        template = _create_db(f"migrated_by_{role}_{var.split('_')[0].lower()}")
        manage(["migrate", "--no-input", "-v", "0"], {var: template}, role=role)
        _MIGRATED[(role, var)] = template
    return _create_db(name, template=template)


def _create_db(name: str, template: str | None = None) -> str:
    import psycopg
    from psycopg import sql

    name = pgplugin.db_name(name)
    create = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
    if template is not None:
        create += sql.SQL(" TEMPLATE {}").format(sql.Identifier(template.rsplit("/", 1)[1]))
    with psycopg.connect(pgplugin.server_url("postgres"), autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )
        conn.execute(create)
    return pgplugin.server_url(name)


def start_stack(prefix: str, extra_env: dict[str, str] | None = None) -> LiveStack:
    env = {
        "DJANGO_SECRET_KEY": os.environ["DJANGO_SECRET_KEY"],
        "DLOCK_PROOF_KEYS": os.environ["DLOCK_PROOF_KEYS"],
        "DJANGO_DEBUG": "false",
        "LOCK_BACKEND": "pg",
        "DLOCK_CREDENTIALS": credentials.CREDENTIALS,
        "DLOCK_EXECUTOR_CREDENTIAL": credentials.EXECUTOR,
        "DLOCK_OPERATOR_CREDENTIAL": credentials.OPERATOR,
        **migrated_live_databases(prefix),
        **(extra_env or {}),
    }
    ports = {role: free_port() for role in ROLES}
    for role, port in ports.items():
        env[URL_ENV[role]] = f"http://127.0.0.1:{port}"
    logdir = Path(tempfile.mkdtemp(prefix=f"dlock-{prefix}-logs-"))
    stack = LiveStack(env=env, logdir=logdir)
    for role, port in ports.items():
        stack.procs[role] = RoleProcess(role, port, env, logdir / f"{role}.log").start(wait=False)
    for proc in stack.procs.values():
        proc.wait_ready()
    return stack


def stop_stack(stack: LiveStack) -> None:
    stop_all(stack.procs.values())


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup):
    """pytest-django's test databases, dropped at the end of the session without the roles'
    statement and lock timeouts: DROP DATABASE waits for a checkpoint, which on a busy CI
    machine can outlast DB_STATEMENT_TIMEOUT_MS (the drop was cancelled and the database left
    behind, with a PytestWarning). A later `-c` in libpq's options wins over an earlier one.
    The process-wide lock backend's listener thread holds two sessions of its own on the test
    lockdb (LISTEN and housekeeping): it is closed first, else the drop finds them ("being
    accessed by other users")."""
    yield
    from django.db import connections

    from lockserver.backends import reset_backend

    reset_backend()

    for alias in connections:
        options = connections[alias].settings_dict.setdefault("OPTIONS", {})
        options["options"] = f"{options.get('options', '')} {UNBOUNDED_STATEMENTS}".strip()


UNBOUNDED_STATEMENTS = "-c statement_timeout=0 -c lock_timeout=0"


@pytest.fixture(scope="session")
def live_stack():
    stack = start_stack("live")
    yield stack
    stop_stack(stack)


@pytest.fixture(scope="session")
def admin_url(live_stack) -> str:
    """The live stack's admin role (started on first use), its URL."""
    return live_stack.start_admin().url


def fresh_etcd() -> EtcdServer:
    """A started etcd server of its own: free ports, an empty data directory."""
    datadir = Path(tempfile.mkdtemp(prefix="dlock-etcd-")) / "data"
    server = EtcdServer(datadir, free_port(), free_port())
    server.start()
    return server


@pytest.fixture(scope="session")
def etcd_server():
    if not (shutil.which("etcd") or Path("/usr/bin/etcd").exists()):
        pytest.fail("etcd is not installed (apt-get install etcd-server); .ci/run installs it")
    server = fresh_etcd()
    yield server
    server.stop()


def raw_request(port: int, payload: bytes) -> bytes:
    """Send raw bytes to 127.0.0.1:port and read until the server closes (for requests an HTTP
    client library refuses to send); the suite's credential is added to a complete head that
    has none (tests.credentials)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(credentials.with_authorization(payload))
        chunks = []
        while data := sock.recv(65536):
            chunks.append(data)
    return b"".join(chunks)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """A shuffled run (`make test-shuffled`, `-p randomly`) names its seed last, -q or not, so
    a failure that depends on the order can be replayed."""
    if not config.pluginmanager.hasplugin("randomly"):
        return
    seed = config.getoption("randomly_seed", None)
    if isinstance(seed, int):
        terminalreporter.write_line(
            f"[dlock] shuffled order: replay with `make test-shuffled SEED={seed}` "
            f"(pytest -p randomly --randomly-seed={seed})"
        )
