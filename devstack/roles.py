"""A role under gunicorn behind its own nginx, and `manage.py` for a role: how the stack runs
dlock's own code.

Every started role is "a pod" (devstack.pod): gunicorn on a unix socket in the pod's directory
(no port to race for) and an nginx on the role's public port in front of it (devstack.proxy,
deploy/nginx/), as each server pod in k8s/ runs an nginx sidecar.

A started role can be written down (`record()`: its argv, its whole environment, its port and
log) and started again from that record, so a restart reproduces exactly what was started.
"""

from __future__ import annotations

import grp
import json
import os
import secrets
import shutil
import signal
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devstack import proxy, proxy_events
from devstack.common import PROJECT, PYTHON, StackError, ready, wait_until
from devstack.envfile import public_keys_of
from devstack.pod import LOG_MAX_BYTES
from devstack.secrets_env import caller_environment

# Pod directories live here, not under the run or test directory: a unix socket's path must
# stay under 108 bytes. Sticky and world-writable like /tmp; each pod's own directory is private.
POD_ROOT = Path("/tmp/dlock-pods")  # noqa: S108 - see above


def new_pod_dir(instance: str, port: int) -> Path:
    """A private directory for one pod: gunicorn's socket, nginx's config, pid and temp files."""
    return make_pod_dir(POD_ROOT / f"{instance}-{port}-{secrets.token_hex(3)}")


def remove_pod_dir(path: Path) -> None:
    """Only a directory of POD_ROOT (a record names its own)."""
    if path.parent == POD_ROOT:
        shutil.rmtree(path, ignore_errors=True)


def make_pod_dir(path: Path) -> Path:
    """As root, nginx's worker runs as nobody: the directory is group `nogroup` (r-x), so that
    worker can reach the socket and no other local user can."""
    POD_ROOT.mkdir(exist_ok=True)
    if POD_ROOT.stat().st_uid == os.geteuid():
        POD_ROOT.chmod(0o1777)
    path.mkdir(mode=0o700, exist_ok=True)
    if os.geteuid() == 0:
        os.chown(path, 0, grp.getgrnam("nogroup").gr_gid)
        path.chmod(0o750)
    return path


def fencing_keys_for(role: str, env: dict[str, str]) -> dict[str, str]:
    """`env` as `role` may hold it: the fencing-proof private keys (DLOCK_PROOF_KEYS) for the
    lock server alone; every other role gets the public keys (DLOCK_FENCING_PUBLIC_KEYS),
    derived from the private ones when a harness hands one environment to every role."""
    private = env.get("DLOCK_PROOF_KEYS")
    if not private or role == "lockserver":
        return env
    out = {k: v for k, v in env.items() if k != "DLOCK_PROOF_KEYS"}
    out.setdefault("DLOCK_FENCING_PUBLIC_KEYS", public_keys_of(private))
    return out


@dataclass
class RoleProcess:
    """One role under gunicorn behind its nginx on 127.0.0.1:port (`app`: the WSGI module, for
    test and bench apps that run under the same gunicorn config; ready = 200 on /health/ready).

    `process` is the pod (devstack.pod): signal it as the role, its process group reaches
    gunicorn and nginx. `tls` = (certificate, key) paths: the proxy speaks https on the port.

    `env` is laid over the allow-listed part of this process's environment
    (devstack.secrets_env.caller_environment) unless `inherit_environ` is false (a role
    restarted from its record gets exactly its recorded environment and argv)."""

    role: str
    port: int
    env: dict[str, str]
    logfile: Path
    process: subprocess.Popen | None = None
    app: str = "settings.wsgi"
    argv: list[str] | None = None
    # What the pod runs behind its nginx (default: gunicorn with settings/gunicorn.py and `app`);
    # e.g. the image's entrypoint, as a container behind its proxy sidecar.
    server: list[str] | None = None
    inherit_environ: bool = True
    name: str = ""  # the instance name: `lockserver`, `lockserver-2`, … (default: the role)
    started_env: dict[str, str] = field(default_factory=dict, repr=False)
    pod_dir: Path | None = None
    tls: tuple[str, str] | None = None

    @property
    def url(self) -> str:
        scheme = "https" if self.tls else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    @property
    def socket_path(self) -> Path:
        assert self.pod_dir is not None
        return self.pod_dir / "gunicorn.sock"

    @property
    def proxy_log(self) -> Path:
        """nginx's own error log (plain text, not JSON), beside the role's log."""
        return self.logfile.with_name(self.logfile.stem + ".nginx.log")

    @property
    def instance(self) -> str:
        return self.name or self.role

    def command(self) -> list[str]:
        if self.argv:
            return list(self.argv)
        assert self.pod_dir is not None
        env = self.started_env or self.environment()
        return [
            PYTHON,
            "-m",
            "devstack.pod",
            "--nginx-conf",
            str(self.pod_dir / "nginx.conf"),
            "--nginx-prefix",
            str(self.pod_dir),
            "--nginx-log",
            str(self.proxy_log),
            "--drain-timeout",
            str(proxy.shutdown_timeout_s(self.role, env)),
            # the role's log capped: rotated by the pod (DLOCK_LOG_MAX_BYTES, 3 older files)
            "--log",
            str(self.logfile),
            "--log-max-bytes",
            str(env.get("DLOCK_LOG_MAX_BYTES") or LOG_MAX_BYTES),
            "--upstream-socket",
            str(self.socket_path),
            "--",
            *(self.server or self.gunicorn()),
        ]

    def gunicorn(self) -> list[str]:
        return [PYTHON, "-m", "gunicorn", "-c", str(PROJECT / "settings" / "gunicorn.py"), self.app]

    def environment(self) -> dict[str, str]:
        base = caller_environment() if self.inherit_environ else {}
        assert self.pod_dir is not None
        return {
            **fencing_keys_for(self.role, proxy_events.with_port({**base, **self.env})),
            "ROLE": self.role,
            "PORT": str(self.port),
            "GUNICORN_BIND": f"unix:{self.socket_path}",
            "DLOCK_PUBLIC_ADDRESS": f"127.0.0.1:{self.port}",
        }

    def proxy_config(self, env: dict[str, str]) -> proxy.ProxyConfig:
        assert self.pod_dir is not None
        metrics = env.get("METRICS_PORT")
        return proxy.ProxyConfig(
            role=self.role,
            listen=f"127.0.0.1:{self.port}",
            upstream=f"unix:{self.socket_path}",
            error_log=str(self.proxy_log),
            env=env,
            metrics_listen=f"127.0.0.1:{metrics}" if metrics else None,
            tls_certificate=self.tls[0] if self.tls else None,
            tls_key=self.tls[1] if self.tls else None,
        )

    def start(self, *, wait: bool = True, timeout: float = 60) -> RoleProcess:
        self.logfile.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.logfile, "ab")
        if self.pod_dir is None:
            self.pod_dir = new_pod_dir(self.instance, self.port)
        elif not self.pod_dir.is_dir():  # a record's directory, removed since: the same path
            make_pod_dir(self.pod_dir)
        if not self.started_env or self.inherit_environ:
            self.started_env = self.environment()
        proxy.fill(self.pod_dir, self.proxy_config(self.started_env))
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
            return ready(self.url, ca=self.started_env.get("DLOCK_CA_BUNDLE"))

        wait_until(check, timeout=timeout, what=f"{self.role} ready on {self.url}")

    def stop(self, timeout: float = 15) -> None:
        """Drain (SIGTERM to the pod: nginx, then gunicorn); SIGKILL both after `timeout`."""
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        if self.pod_dir is not None and self.process and self.process.poll() is not None:
            remove_pod_dir(self.pod_dir)  # a start() after this makes the same path again

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
            "pod_dir": str(self.pod_dir),
            "tls": list(self.tls) if self.tls else None,
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
            started_env=dict(record["env"]),
            pod_dir=Path(record["pod_dir"]) if record.get("pod_dir") else None,
            tls=tuple(record["tls"]) if record.get("tls") else None,  # type: ignore[arg-type]
        )


def stop_all(processes: Iterable[RoleProcess], timeout: float = 15) -> None:
    """`RoleProcess.stop` for several roles at once: every one gets its SIGTERM before any is
    waited for, so they drain side by side rather than one after the other (a second SIGTERM
    from `stop` only repeats the request to a pod already draining)."""
    processes = list(processes)
    for proc in processes:
        if proc.process and proc.process.poll() is None:
            proc.process.send_signal(signal.SIGTERM)
    for proc in processes:
        proc.stop(timeout)


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
    """Each database is migrated by the role that holds every table in it: lockdb by the lock
    server, paydb by the admin (payments' and the rail proxy's tables, and the admin's own:
    users, sessions, audit log, django-axes), raildb by the rail stub. The three share no
    table, so they run side by side; the first that fails is raised once all have ended."""
    running = [
        subprocess.Popen(
            [PYTHON, str(PROJECT / "manage.py"), "migrate", "--no-input", "-v", "0"],
            cwd=PROJECT,
            env={**os.environ, **env, "ROLE": role},
        )
        for role in ("lockserver", "admin", "railstub")
    ]
    for process in running:
        process.wait()
    for process in running:
        if process.returncode:
            raise subprocess.CalledProcessError(process.returncode, process.args)
