"""Fixtures for the production-shape tests: a probe role under the real gunicorn config."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from devstack.common import free_port
from devstack.roles import RoleProcess, manage
from tests import credentials
from tests.conftest import _create_db, migrated_db
from tests.production.probe_urls import SCHEMA


@dataclass
class Probe:
    """gunicorn with settings/gunicorn.py serving the probe URLconf against its own database."""

    port: int
    db_url: str
    logfile: Path
    process: subprocess.Popen  # the pod (devstack.pod): nginx in front of gunicorn
    role: RoleProcess

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def sql(self, statement: str, params: tuple = ()) -> list[tuple]:
        with psycopg.connect(self.db_url, autocommit=True) as conn:
            cur = conn.execute(statement, params)
            return cur.fetchall() if cur.description else []

    def log(self) -> str:
        return self.logfile.read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


def start_probe(tmp_path: Path, tls: tuple[str, str] | None = None, **env: str) -> Probe:
    """The probe role; `tls` = (certificate, key): its proxy speaks https."""
    db_url = _create_db(f"probe_{uuid.uuid4().hex[:12]}")
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(SCHEMA)
    port = free_port()
    role = RoleProcess(
        "railstub",  # the gunicorn config's per-role defaults; the URLconf is the probe's
        port,
        {"RAIL_DATABASE_URL": db_url, "DJANGO_DEBUG": "false", **env},
        tmp_path / f"probe-{port}.log",
        app="tests.production.probe_wsgi",
        tls=tls,
    ).start()
    return Probe(port, db_url, role.logfile, role.process, role)


@pytest.fixture
def probe_factory(tmp_path):
    started: list[Probe] = []

    def factory(**env: str) -> Probe:
        probe = start_probe(tmp_path, **env)
        started.append(probe)
        return probe

    yield factory
    for probe in started:
        probe.stop()


def migrated_paydb(name: str, **extra: str) -> tuple[str, dict[str, str]]:
    """A fresh paydb (`name` plus a random suffix), migrated, and the payments role's
    environment for it (`extra` added)."""
    db_url = migrated_db(f"{name}_{uuid.uuid4().hex[:10]}", "payments", "PAY_DATABASE_URL")
    env = {
        "PAY_DATABASE_URL": db_url,
        "DJANGO_SECRET_KEY": os.environ["DJANGO_SECRET_KEY"],
        "DJANGO_DEBUG": "false",
        **extra,
    }
    return db_url, env


def seed_payouts(env: dict[str, str], *, payouts: int, balance_minor: int = 10_000) -> dict:
    """One account with `payouts` PENDING payouts of 100; seed_payouts' JSON (accounts, payouts)."""
    done = manage(
        [
            "seed_payouts",
            "--accounts=1",
            f"--payouts-per-account={payouts}",
            f"--balance-minor={balance_minor}",
            "--amount-minor=100",
            "--json",
        ],
        env,
        role="payments",
        capture=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def payments_pod(name: str, logdir: Path, **extra: str) -> RoleProcess:
    """A payment-resource pod (gunicorn behind its nginx) on a fresh paydb seeded with one
    PENDING payout (`payout_id`); `extra` added to its environment. Started: stop() it."""
    _, env = migrated_paydb(name, **extra)
    ids = seed_payouts(env, payouts=1)
    proc = RoleProcess("payments", free_port(), env, logdir / "payments.log").start()
    proc.payout_id = ids["payouts"][0]
    return proc


def lockserver_pod(name: str, logdir: Path, **extra: str) -> RoleProcess:
    """A lock-server pod on a fresh lockdb (pg backend, the suite's credentials); `extra` added
    to its environment. Started: stop() it."""
    env = {
        "LOCK_DATABASE_URL": migrated_db(
            f"{name}_{uuid.uuid4().hex[:10]}", "lockserver", "LOCK_DATABASE_URL"
        ),
        "LOCK_BACKEND": "pg",
        "DJANGO_DEBUG": "false",
        "DLOCK_CREDENTIALS": credentials.CREDENTIALS,
        **extra,
    }
    return RoleProcess("lockserver", free_port(), env, logdir / "lockserver.log").start()
