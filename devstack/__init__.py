"""The local dev stack: a private PostgreSQL (and etcd) plus the four roles under gunicorn.

Used by `make up/down/status/clean` (`python -m devstack …`), by the demo, the experiment, the
benchmarks and the test suite, so the stack a newcomer starts is the stack the tests exercise.
Development tooling: no server role imports it, and it is not in the image.

Modules: `common` (names, ports, waiting), `postgres` (PgCluster), `etcd` (EtcdServer),
`roles` (RoleProcess, manage, migrate_all), `envfile` (.run/stack.env), `stack` (up, down,
status, clean, restart_role), `demo` (`make demo`). The names below are the public API.
"""

from __future__ import annotations

from devstack.common import (
    DATABASES,
    DB_URL_ENV,
    DEFAULT_PORTS,
    PROJECT,
    PYTHON,
    REPLICA_PORT_STEP,
    REPLICATED_ROLES,
    ROLE_DATABASES,
    ROLES,
    URL_ENV,
    StackError,
    bound_listener,
    free_port,
    pid_alive,
    port_open,
    ready,
    say,
    wait_until,
)
from devstack.envfile import new_proof_keys, read_env, run_dir, write_env
from devstack.etcd import EtcdServer, etcd_cluster, etcd_healthy
from devstack.postgres import PgCluster, pg_bindir, private_datadir, state_root
from devstack.roles import RoleProcess, manage, migrate_all, stop_all
from devstack.stack import Topology, TopologyMismatch, clean, down, restart_role, status, up

__all__ = [
    "DATABASES",
    "DB_URL_ENV",
    "DEFAULT_PORTS",
    "PROJECT",
    "PYTHON",
    "REPLICATED_ROLES",
    "REPLICA_PORT_STEP",
    "ROLES",
    "ROLE_DATABASES",
    "URL_ENV",
    "EtcdServer",
    "PgCluster",
    "RoleProcess",
    "StackError",
    "Topology",
    "TopologyMismatch",
    "clean",
    "down",
    "etcd_cluster",
    "etcd_healthy",
    "bound_listener",
    "free_port",
    "new_proof_keys",
    "manage",
    "migrate_all",
    "pg_bindir",
    "pid_alive",
    "port_open",
    "private_datadir",
    "read_env",
    "ready",
    "restart_role",
    "run_dir",
    "say",
    "state_root",
    "status",
    "stop_all",
    "up",
    "wait_until",
    "write_env",
]
