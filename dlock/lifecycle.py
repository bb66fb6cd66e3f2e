"""A server role says when it started, when it drains and when it stopped: one JSON line each.

`service_started` (role, service, version, backend, listen, publicAddress, workers, threads,
pid) when gunicorn is ready, `service_draining` when a worker got SIGTERM (requests in
flight), `service_stopped` when the master exits, so `kubectl logs` of a pod says what ran.
gunicorn hooks (settings/gunicorn.py) call these; the master has no Django, so it configures the
root logger exactly as the role's LOGGING does (the workers' Django setup replaces it). The
executor logs the same lines from its command (executor/management/commands/run_executor.py).
"""

from __future__ import annotations

import functools
import logging
import logging.config
import os
import tomllib
from pathlib import Path
from typing import Any

from dlock.logs import log_event
from dlock.roles import SERVICE_NAMES

_PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def version() -> str:
    """The release: DLOCK_VERSION (`make image` builds it in from pyproject), else what the
    checkout's pyproject.toml says, else "unknown"."""
    return os.environ.get("DLOCK_VERSION") or _checkout_version()


@functools.cache
def _checkout_version() -> str:
    try:
        with _PYPROJECT.open("rb") as fh:
            return str(tomllib.load(fh)["project"]["version"])
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return "unknown"


def role() -> str:
    return os.environ.get("ROLE", "")


def identity() -> dict[str, Any]:
    """The fields every lifecycle line carries."""
    name = role()
    return {"role": name, "version": version(), "backend": backend(name), "pid": os.getpid()}


def backend(name: str) -> str:
    """Where the role keeps its state: the lock-server's LOCK_BACKEND, PostgreSQL for the
    others' own databases, none for the HTTP-only executor."""
    if name == "lockserver":
        return os.environ.get("LOCK_BACKEND") or "pg"
    return "none" if name == "executor" else "postgresql"


def configure_master_logging() -> None:
    service = SERVICE_NAMES.get(role(), "dlock")
    logging.config.dictConfig(
        {
            "version": 1,
            "disable_existing_loggers": False,
            "formatters": {"json": {"()": "dlock.logs.JsonFormatter", "service": service}},
            "handlers": {"stdout": {"class": "logging.StreamHandler", "formatter": "json"}},
            "root": {"handlers": ["stdout"], "level": os.environ.get("DLOCK_LOG_LEVEL", "INFO")},
        }
    )


def _server_fields(server: Any) -> dict[str, Any]:
    cfg = server.cfg
    return {
        "listen": [str(address) for address in cfg.address],
        "publicAddress": os.environ.get("DLOCK_PUBLIC_ADDRESS") or None,
        "workers": cfg.workers,
        "threads": cfg.threads,
        "workerClass": cfg.worker_class_str,
    }


def when_ready(server: Any) -> None:
    """gunicorn `when_ready`: the master is listening and about to start its workers."""
    configure_master_logging()
    log_event("service_started", **identity(), **_server_fields(server))


def on_exit(server: Any) -> None:
    """gunicorn `on_exit`: every worker has finished (or was cut at graceful_timeout)."""
    log_event("service_stopped", **identity())


def draining(worker: Any) -> None:
    """A worker got SIGTERM: its listener is closed, requests in flight get graceful_timeout."""
    log_event(
        "service_draining",
        **identity(),
        gracefulTimeoutS=worker.cfg.graceful_timeout,
    )


def started_command(command: str, **fields: Any) -> None:
    """`service_started` of a process that is not a gunicorn role (the executor's command)."""
    log_event("service_started", **identity(), command=command, **fields)


def stopped_command(command: str, **fields: Any) -> None:
    log_event("service_stopped", **identity(), command=command, **fields)
