"""A role under gunicorn, and `manage.py` for a role: how the stack runs dlock's own code.

A started role can be written down (`record()`: its argv, its whole environment, its port and
log) and started again from that record, so a restart reproduces exactly what was started.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devstack.common import PROJECT, PYTHON, StackError, ready, wait_until


@dataclass
class RoleProcess:
    """One role under gunicorn on 127.0.0.1:port (`app`: the WSGI module, for test and bench
    apps that run under the same gunicorn config; ready = 200 on /health/ready).

    `env` is laid over this process's environment unless `inherit_environ` is false (a role
    restarted from its record gets exactly its recorded environment and argv)."""

    role: str
    port: int
    env: dict[str, str]
    logfile: Path
    process: subprocess.Popen | None = None
    app: str = "settings.wsgi"
    argv: list[str] | None = None
    inherit_environ: bool = True
    name: str = ""  # the instance name: `lockserver`, `lockserver-2`, … (default: the role)
    started_env: dict[str, str] = field(default_factory=dict, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def instance(self) -> str:
        return self.name or self.role

    def command(self) -> list[str]:
        if self.argv:
            return list(self.argv)
        return [PYTHON, "-m", "gunicorn", "-c", str(PROJECT / "settings" / "gunicorn.py"), self.app]

    def environment(self) -> dict[str, str]:
        base = dict(os.environ) if self.inherit_environ else {}
        return {**base, **self.env, "ROLE": self.role, "PORT": str(self.port)}

    def start(self, *, wait: bool = True, timeout: float = 60) -> RoleProcess:
        self.logfile.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.logfile, "ab")
        self.started_env = self.environment()
        self.argv = self.command()
        self.process = subprocess.Popen(
            self.argv,
            cwd=PROJECT,
            env=self.started_env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        if wait:
            self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 60) -> None:
        def check() -> bool:
            if self.process and self.process.poll() is not None:
                tail = self.logfile.read_text(errors="replace")[-3000:]
                raise StackError(f"{self.role} exited with {self.process.returncode}:\n{tail}")
            return ready(self.url)

        wait_until(check, timeout=timeout, what=f"{self.role} ready on {self.url}")

    def stop(self, timeout: float = 15) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()

    def record(self) -> dict[str, Any]:
        """What was started (call after `start`): enough to start it again identically."""
        if self.process is None:
            raise StackError(f"{self.instance} has not been started")
        return {
            "role": self.role,
            "name": self.instance,
            "port": self.port,
            "app": self.app,
            "argv": self.argv,
            "env": self.started_env,
            "logfile": str(self.logfile),
            "pid": self.process.pid,
        }

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> RoleProcess:
        return cls(
            role=record["role"],
            port=int(record["port"]),
            env=dict(record["env"]),
            logfile=Path(record["logfile"]),
            app=record["app"],
            argv=list(record["argv"]),
            inherit_environ=False,
            name=record["name"],
        )


def write_record(path: Path, record: dict[str, Any]) -> None:
    """The record holds the role's secrets (its environment): readable by its owner only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1, sort_keys=True))
    tmp.chmod(0o600)
    tmp.replace(path)


def read_record(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def manage(
    args: Iterable[str],
    env: dict[str, str],
    *,
    role: str = "ops",
    check: bool = True,
    capture: bool = False,
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PYTHON, str(PROJECT / "manage.py"), *args],
        cwd=PROJECT,
        env={**os.environ, **env, "ROLE": role},
        check=check,
        text=True,
        capture_output=capture,
    )


def migrate_all(env: dict[str, str]) -> None:
    """Each server role migrates its own database (the ops role routes apps the same way)."""
    for role in ("lockserver", "payments", "railstub"):
        manage(["migrate", "--no-input", "-v", "0"], env, role=role)
