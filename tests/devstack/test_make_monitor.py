"""`make monitor` honours DLOCK_EXECUTOR_METRICS and MONITOR_PORT from the make command line and
from the environment: the real target starts Debian's Prometheus on that port, scraping the
executors named there (over the stack file's, which names none). Before, the command line's
DLOCK_EXECUTOR_METRICS never reached devstack.monitor: the executor job had no target.

The venv and sysdeps prerequisites are taken as made (`make -o`): the suite runs in that venv."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import requests
import yaml

from devstack.common import PROJECT, free_port
from devstack.envfile import write_env
from devstack.monitor import prepare

pytestmark = [pytest.mark.live]

MAKE = ["make", "--no-print-directory", "-o", ".venv/.installed", "-o", "sysdeps", "monitor"]


def stack_file(run: Path) -> dict[str, int]:
    ports = {name: free_port() for name in ("lock", "pay", "proxy", "stub", "admin")}
    run.mkdir(parents=True, exist_ok=True)
    write_env(
        run / "stack.env",
        {
            "LOCK_SERVER_URL": f"http://127.0.0.1:{ports['lock']}",
            "PAYMENTS_URL": f"http://127.0.0.1:{ports['pay']}",
            "RAIL_PROXY_URL": f"http://127.0.0.1:{ports['proxy']}",
            "RAIL_STUB_URL": f"http://127.0.0.1:{ports['stub']}",
            "ADMIN_URL": f"http://127.0.0.1:{ports['admin']}",
            "LOCK_BACKEND": "pg",
        },
    )
    return ports


def executor_targets(run: Path, argv: list[str], env: dict[str, str], port: int) -> set[str]:
    """Run `argv` (make monitor …) until Prometheus on `port` lists its executor targets."""
    log = run / "monitor.log"
    proc = subprocess.Popen(
        argv,
        cwd=PROJECT,
        env={**os.environ, "DLOCK_RUN_DIR": str(run), **env},
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            try:
                active = requests.get(f"{base}/api/v1/targets", timeout=2).json()["data"]
            except requests.RequestException:
                time.sleep(0.2)
                continue
            found = {
                t["labels"]["instance"]
                for t in active["activeTargets"]
                if t["labels"]["job"] == "executor"
            }
            if found:  # file_sd hands the targets over shortly after start
                return found
            time.sleep(0.2)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)


def test_make_monitor_takes_the_executors_and_port_from_the_command_line(tmp_path):
    run = tmp_path / "run"
    stack_file(run)
    port, executors = free_port(), f"127.0.0.1:{free_port()},127.0.0.1:{free_port()}"
    argv = [*MAKE, f"DLOCK_EXECUTOR_METRICS={executors}", f"MONITOR_PORT={port}"]
    found = executor_targets(run, argv, {}, port)
    assert found == set(executors.split(","))


def test_make_monitor_takes_the_executors_and_port_from_the_environment(tmp_path):
    run = tmp_path / "run"
    stack_file(run)
    port, executor = free_port(), f"127.0.0.1:{free_port()}"
    env = {"DLOCK_EXECUTOR_METRICS": executor, "MONITOR_PORT": str(port)}
    assert executor_targets(run, MAKE, env, port) == {executor}


def test_under_tls_every_role_is_scraped_over_https_and_the_executors_over_http(tmp_path):
    """`make up TLS=1`: the roles' proxies speak TLS only, the executor's own metrics server
    (prometheus_client's) plain HTTP, as k8s/monitoring/pod-monitor.yaml scrapes them."""
    config = prepare({"DLOCK_TLS": "1", "DLOCK_CA_BUNDLE": "/ca.crt"}, tmp_path)
    schemes = {
        job["job_name"]: job.get("scheme", "http")
        for job in yaml.safe_load(config.read_text())["scrape_configs"]
    }
    assert schemes.pop("executor") == "http"
    assert set(schemes.values()) == {"https"}, schemes
