"""What every part of the dev stack shares: where the project is, names, ports, waiting."""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path

import requests

PROJECT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
ROLES = ("lockserver", "payments", "railproxy", "railstub")
DEFAULT_PORTS = {"lockserver": 8081, "payments": 8082, "railproxy": 8083, "railstub": 8084}
REPLICA_PORT_STEP = 100  # replica n of a role listens on its port + (n - 1) * 100
REPLICATED_ROLES = ("lockserver", "payments", "railproxy")  # the rail stub is the outside world
URL_ENV = {
    "lockserver": "LOCK_SERVER_URL",
    "payments": "PAYMENTS_URL",
    "railproxy": "RAIL_PROXY_URL",
    "railstub": "RAIL_STUB_URL",
}
DATABASES = ("lockdb", "paydb", "raildb")
DB_URL_ENV = {
    "lockdb": "LOCK_DATABASE_URL",
    "paydb": "PAY_DATABASE_URL",
    "raildb": "RAIL_DATABASE_URL",
}
ROLE_DATABASES = {
    "lockserver": ("lockdb",),
    "payments": ("paydb",),
    "railstub": ("raildb",),
}


class StackError(RuntimeError):
    pass


def say(message: str) -> None:
    print(f"[dlock] {message}", flush=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex((host, port)) == 0


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def wait_until(
    predicate: Callable[[], bool], *, timeout: float, what: str, interval: float = 0.1
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise StackError(f"timed out after {timeout:.0f}s waiting for {what}")


def ready(url: str) -> bool:
    try:
        return requests.get(f"{url}/health/ready", timeout=2).status_code == 200
    except requests.RequestException:
        return False


def live(url: str) -> bool:
    """The process answers `/health/live` (it runs, whatever its dependencies do)."""
    try:
        return requests.get(f"{url}/health/live", timeout=2).status_code == 200
    except requests.RequestException:
        return False


def readiness_checks(url: str) -> str:
    """`/health/ready`'s checks as `name=STATE …` (for messages), or why there are none."""
    try:
        body = requests.get(f"{url}/health/ready", timeout=2).json()
    except (requests.RequestException, ValueError) as exc:
        return f"readiness unanswered: {type(exc).__name__}"
    checks = body.get("checks") or (body.get("details") or {}).get("checks") or {}
    return " ".join(f"{name}={state}" for name, state in checks.items()) or "no checks"
