"""The suite's PostgreSQL under pytest-xdist: every worker starts its own server, the controller
(which runs no test) none.

A Docker engine is out of reach on this machine, so `docker` and `testcontainers` are stand-ins
on the child suite's path: the engine "answers" and each container start is written to a file.
The plugin, pytest, pytest-xdist and pytest-django are the real ones.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from devstack.common import PROJECT
from tests import pgplugin

_FAKE_DOCKER = """
class _Client:
    def ping(self):
        return True


def from_env(timeout=None):
    return _Client()
"""

_FAKE_POSTGRES = """
import json
import os


class PostgresContainer:
    def __init__(self, image, driver=None):
        self.image = image

    def start(self):
        with open(os.environ["FAKE_CONTAINER_LOG"], "a") as log:
            log.write(json.dumps({"pid": os.getpid(),
                                  "worker": os.environ.get("PYTEST_XDIST_WORKER")}) + "\\n")
        return self

    def get_connection_url(self):
        return os.environ["FAKE_SERVER_URL"]

    def stop(self):
        pass
"""

_CHILD_TEST = """
import os


def test_{n}_names_databases_of_its_own_worker():
    worker = os.environ["PYTEST_XDIST_WORKER"]
    assert os.environ["PAY_DATABASE_URL"] == os.environ["FAKE_SERVER_URL"].replace(
        "postgresql://", "postgres://").rsplit("/", 1)[0] + f"/dlock_paydb_{{worker}}"
"""


def test_under_xdist_each_worker_starts_one_container_and_the_controller_none(tmp_path):
    fakes = tmp_path / "fakes"
    (fakes / "docker").mkdir(parents=True)
    (fakes / "docker" / "__init__.py").write_text(_FAKE_DOCKER)
    (fakes / "testcontainers").mkdir()
    (fakes / "testcontainers" / "__init__.py").write_text("")
    (fakes / "testcontainers" / "postgres.py").write_text(_FAKE_POSTGRES)
    suite = tmp_path / "suite"
    suite.mkdir()
    for n in ("first", "second"):
        (suite / f"test_{n}.py").write_text(_CHILD_TEST.format(n=n))
    log = tmp_path / "containers.jsonl"
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("PYTEST_", "DLOCK_TEST_DATABASE_URL", "DLOCK_PORT_SLICE"))
    }
    env.update(
        PYTHONPATH=f"{fakes}{os.pathsep}{PROJECT}",
        FAKE_CONTAINER_LOG=str(log),
        FAKE_SERVER_URL=pgplugin.SERVER_URL.replace("postgres://", "postgresql://"),
    )
    child = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-c",
            str(Path(PROJECT) / "pyproject.toml"),
            "--rootdir",
            str(PROJECT),
            "-p",
            "no:cacheprovider",
            "-n",
            "2",
            "--dist",
            "loadfile",
            "-q",
            str(suite),
        ],
        cwd=PROJECT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert child.returncode == 0, child.stdout + child.stderr
    assert "2 passed" in child.stdout, child.stdout
    starts = [json.loads(line) for line in log.read_text().splitlines()]
    assert sorted(start["worker"] for start in starts) == ["gw0", "gw1"], starts
    assert len({start["pid"] for start in starts}) == 2, starts
