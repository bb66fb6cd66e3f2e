"""Real PostgreSQL for the whole suite, chosen before Django reads its settings.

Order: DLOCK_TEST_DATABASE_URL (a server URL) if set; else testcontainers when a Docker engine
answers; else a throwaway cluster started with initdb/pg_ctl in a temp dir (fsync off).
Never SQLite, never a mock.

Under `pytest -n N` (pytest-xdist; `make test` runs TEST_WORKERS of them) each worker is a suite
of its own: its own cluster (or, on a given server, databases suffixed with its id) and its own
slice of the reserved ports (devstack.common, DLOCK_PORT_SLICE); the controller, which runs no
test, starts nothing: no cluster, no container (its settings point at a port nothing listens on).
"""

from __future__ import annotations

import atexit
import os
import secrets
import shutil
import tempfile
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

# An xdist worker ("gw0", "gw1", ...) draws its ports from a slice of its own: set before
# devstack is imported, and inherited by every process the worker starts.
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if WORKER:
    os.environ["DLOCK_PORT_SLICE"] = (
        f"{WORKER.removeprefix('gw')}/{os.environ['PYTEST_XDIST_WORKER_COUNT']}"
    )

# Every temporary directory of this process and of what it starts (fixtures' mkdtemp, the
# roles' and etcd's files) goes under one directory of its own, removed when the
# session ends: a run left ~2.2 GB in /tmp (etcd data directories, role logs), and runs in a row
# filled the disk. 0755: as root the suite's clusters run as `postgres`, which must reach them.
# A worker's sits beside the controller's, not inside it (unix socket paths stay short).
_TMP_PARENT = os.environ.setdefault("DLOCK_SUITE_TMP_PARENT", tempfile.gettempdir())
# pytest's own tmp_path stays where it was (it keeps its last three runs): a longer prefix put
# the pods' unix socket paths in tests/devstack/test_edge_config.py past nginx's limit.
os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", _TMP_PARENT)
SUITE_TMP = Path(tempfile.mkdtemp(prefix=f"dlock-suite-{WORKER or 'main'}-", dir=_TMP_PARENT))
SUITE_TMP.chmod(0o755)
os.environ["TMPDIR"] = tempfile.tempdir = str(SUITE_TMP)

from devstack.common import free_port  # noqa: E402 - after the port slice it reads
from devstack.postgres import PgCluster  # noqa: E402 - after the port slice it reads

_cluster: PgCluster | None = None
_container = None


def _docker_answers() -> bool:
    try:
        import docker

        client = docker.from_env(timeout=2)
        client.ping()
        return True
    except Exception:  # no engine, no socket, no permission: fall back to initdb
        return False


def db_name(name: str) -> str:
    """The database this process calls `name`: workers sharing a given server never share one."""
    return f"{name}_{WORKER}" if WORKER else name


def _with_db(server_url: str, dbname: str) -> str:
    parts = urlsplit(server_url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{dbname}", parts.query, ""))


def _choose_server() -> str:
    global _cluster, _container
    given = os.environ.get("DLOCK_TEST_DATABASE_URL")
    if given:
        return given
    if _docker_answers():
        from testcontainers.postgres import PostgresContainer

        _container = PostgresContainer("postgres:15", driver=None).start()
        atexit.register(_container.stop)
        return _container.get_connection_url().replace("postgresql://", "postgres://")
    parent = Path(tempfile.mkdtemp(prefix="dlock-test-pg-"))
    parent.chmod(0o755)  # as root the cluster runs as `postgres`, which must reach its datadir
    datadir = parent / "data"
    _cluster = PgCluster(datadir, free_port(), fast=True)
    return f"postgres://postgres@127.0.0.1:{_cluster.port}/postgres"


# Chosen in pytest_load_initial_conftests (below), before pytest-django sets Django up: by then
# the command line says whether this process is an xdist controller.
SERVER_URL = ""
# Where the xdist controller's settings point: nothing listens there, and the controller never
# connects (it runs no test).
_NOWHERE = "postgres://xdist-controller-runs-no-tests@127.0.0.1:1/postgres"


def _runs_no_tests(early_config) -> bool:
    """The xdist controller (`-n N`, N > 0, in a process that is not a worker): it hands the
    tests to its workers and runs none itself."""
    return not WORKER and bool(getattr(early_config.known_args_namespace, "numprocesses", None))


def _prepare(server_url: str) -> None:
    global SERVER_URL
    SERVER_URL = server_url
    os.environ["DLOCK_TEST_SERVER_URL"] = SERVER_URL
    os.environ["LOCK_DATABASE_URL"] = _with_db(SERVER_URL, db_name("dlock_lockdb"))
    os.environ["PAY_DATABASE_URL"] = _with_db(SERVER_URL, db_name("dlock_paydb"))
    os.environ["RAIL_DATABASE_URL"] = _with_db(SERVER_URL, db_name("dlock_raildb"))
    os.environ.setdefault("DJANGO_SECRET_KEY", secrets.token_urlsafe(48))
    # One fencing-proof key ring for the suite: in-process views and every role a test starts.
    os.environ.setdefault("DLOCK_PROOF_KEYS", f"t1:{secrets.token_urlsafe(32)}")
    os.environ["DJANGO_DEBUG"] = "false"
    os.environ.setdefault("ROLE", "ops")

    from tests import credentials

    credentials.install()


@pytest.hookimpl(wrapper=True)
def pytest_load_initial_conftests(early_config):
    # A wrapper runs before every plain implementation, pytest-django's (django.setup) included.
    _prepare(_NOWHERE if _runs_no_tests(early_config) else _choose_server())
    return (yield)


def server_url(dbname: str) -> str:
    return _with_db(SERVER_URL, dbname)


def cluster() -> PgCluster | None:
    """The throwaway cluster when the suite started one (tests that stop/start PostgreSQL)."""
    return _cluster


def pytest_configure(config):
    if _cluster is not None and not _cluster.running():
        _cluster.start()


def _clean_up() -> None:
    """Stop the suite's cluster; remove this process's temporary directory (its datadir with it)."""
    global _cluster
    if _cluster is not None:
        _cluster.stop("immediate")
        _cluster = None
    shutil.rmtree(SUITE_TMP, ignore_errors=True)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session):
    # Here, not only at unconfigure: an xdist worker reports itself finished when this hook
    # returns, so the controller waits for this cleanup. Two parallel runs that cleaned up only
    # at unconfigure each left a worker's cluster directory half-removed (likely the worker cut
    # off after reporting itself finished; not proven), none has since.
    _clean_up()


def pytest_unconfigure(config):
    _clean_up()
