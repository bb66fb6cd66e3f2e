"""The local stack: a private PostgreSQL (and etcd) plus the four roles under gunicorn.

Used by `make up/down` (python -m dlock.devstack up|down|status) and by the test suite, so the
stack a newcomer starts is the stack the tests exercise. Standard library + requests only.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import hashlib
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import requests

from dlock.auth import credentials_entry, new_credential  # issue 15

PROJECT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
DEFAULT_PORTS = {"lockserver": 8081, "payments": 8082, "railproxy": 8083, "railstub": 8084}
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


# --------------------------------------------------------------------------- PostgreSQL


def pg_bindir() -> Path:
    """Debian keeps server binaries off PATH in /usr/lib/postgresql/<version>/bin."""
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: (
            int(Path(p).parent.parent.name) if Path(p).parent.parent.name.isdigit() else 0
        ),
    )
    if candidates:
        return Path(candidates[-1]).parent
    found = shutil.which("initdb")
    if found:
        return Path(found).resolve().parent
    raise StackError(
        "PostgreSQL server binaries not found: install them with "
        "`sudo apt-get install -y postgresql` (Debian/Ubuntu) and run again"
    )


def _unprivileged_user() -> str | None:
    """initdb refuses to run as root; as root we run the cluster as `postgres`."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return name
    raise StackError("running as root and no unprivileged user (postgres) exists")


def _as_user(argv: list[str], user: str | None) -> list[str]:
    return ["runuser", "-u", user, "--", *argv] if user else argv


def _chown_tree(path: Path, user: str) -> None:
    entry = pwd.getpwnam(user)
    for root, dirs, files in os.walk(path):
        os.chown(root, entry.pw_uid, entry.pw_gid)
        for name in dirs + files:
            os.chown(os.path.join(root, name), entry.pw_uid, entry.pw_gid)


@dataclass
class PgCluster:
    """A throwaway PostgreSQL cluster on 127.0.0.1:port, trust auth, superuser `postgres`."""

    datadir: Path
    port: int
    fast: bool = False  # fsync off: for tests only, never for numbers that claim durability
    user: str | None = field(default_factory=_unprivileged_user)

    @property
    def logfile(self) -> Path:
        return self.datadir / "server.log"

    def url(self, dbname: str) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{dbname}"

    def initialised(self) -> bool:
        return (self.datadir / "PG_VERSION").exists()

    def init(self) -> None:
        if self.initialised():
            return
        self.datadir.mkdir(parents=True, exist_ok=True)
        if self.user:
            _chown_tree(self.datadir, self.user)
        subprocess.run(
            _as_user(
                [
                    str(pg_bindir() / "initdb"),
                    "-D",
                    str(self.datadir),
                    "-U",
                    "postgres",
                    "--auth=trust",
                    "--encoding=UTF8",
                    "--locale=C",
                ],
                self.user,
            ),
            cwd="/",
            check=True,
            stdout=subprocess.DEVNULL,
        )

    def running(self) -> bool:
        result = subprocess.run(
            _as_user([str(pg_bindir() / "pg_ctl"), "-D", str(self.datadir), "status"], self.user),
            cwd="/",
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        return result.returncode == 0

    def start(self) -> None:
        self.init()
        if self.running():
            return
        options = [
            f"-p {self.port}",
            "-c listen_addresses=127.0.0.1",
            f"-c unix_socket_directories={self.datadir}",
            "-c max_connections=200",
            "-c shared_buffers=128MB",
        ]
        if self.fast:
            options += ["-c fsync=off", "-c synchronous_commit=off", "-c full_page_writes=off"]
        subprocess.run(
            _as_user(
                [
                    str(pg_bindir() / "pg_ctl"),
                    "-D",
                    str(self.datadir),
                    "-l",
                    str(self.logfile),
                    "-w",
                    "-t",
                    "60",
                    "-o",
                    " ".join(options),
                    "start",
                ],
                self.user,
            ),
            cwd="/",
            check=True,
            stdout=subprocess.DEVNULL,
        )

    def stop(self, mode: str = "fast") -> None:
        if not self.initialised() or not self.running():
            return
        subprocess.run(
            _as_user(
                [str(pg_bindir() / "pg_ctl"), "-D", str(self.datadir), "-m", mode, "-w", "stop"],
                self.user,
            ),
            cwd="/",
            check=False,
            stdout=subprocess.DEVNULL,
        )

    def psql(self, sql: str, dbname: str = "postgres") -> str:
        import psycopg

        with psycopg.connect(self.url(dbname), autocommit=True) as conn:
            cur = conn.execute(sql)
            return str(cur.fetchall()) if cur.description else ""

    def create_database(self, name: str, *, recreate: bool = False) -> str:
        import psycopg
        from psycopg import sql

        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            exists = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (name,)
            ).fetchone()
            if exists and recreate:
                conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))
                exists = None
            if not exists:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return self.url(name)


def private_datadir(run_dir: Path, name: str = "pg") -> Path:
    """As root the data directory must be reachable by `postgres`, so it lives under /tmp."""
    if os.geteuid() == 0:
        digest = hashlib.sha256(str(run_dir.resolve()).encode()).hexdigest()[:10]
        return Path("/tmp") / f"dlock-{digest}" / name  # noqa: S108 - root-only, postgres-owned
    return run_dir / name


# --------------------------------------------------------------------------- etcd


@dataclass
class EtcdServer:
    datadir: Path
    client_port: int
    peer_port: int
    process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    def start(self) -> None:
        binary = shutil.which("etcd") or "/usr/bin/etcd"
        if not Path(binary).exists():
            raise StackError(
                "etcd not found: install it with `sudo apt-get install -y etcd-server`"
            )
        self.datadir.mkdir(parents=True, exist_ok=True)
        log = open(self.datadir.parent / f"{self.datadir.name}.log", "ab")  # noqa: SIM115
        env = {**os.environ, "ETCD_UNSUPPORTED_ARCH": os.environ.get("ETCD_UNSUPPORTED_ARCH", "")}
        self.process = subprocess.Popen(
            [
                binary,
                "--name",
                "dlock",
                "--data-dir",
                str(self.datadir),
                "--listen-client-urls",
                self.url,
                "--advertise-client-urls",
                self.url,
                "--listen-peer-urls",
                f"http://127.0.0.1:{self.peer_port}",
                "--initial-advertise-peer-urls",
                f"http://127.0.0.1:{self.peer_port}",
                "--initial-cluster",
                f"dlock=http://127.0.0.1:{self.peer_port}",
                "--log-level",
                "warn",
                # a single member elects itself; the short election timeout lowers etcd's
                # minimum lease TTL from 2 s to 1 s, so ttlMillis=1000 sessions are honoured
                "--heartbeat-interval",
                "50",
                "--election-timeout",
                "500",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        wait_until(lambda: _etcd_healthy(self.url), timeout=30, what=f"etcd on {self.url}")

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def _etcd_healthy(url: str) -> bool:
    try:
        return requests.get(f"{url}/health", timeout=1).status_code == 200
    except requests.RequestException:
        return False


# --------------------------------------------------------------------------- roles


def wait_until(predicate, *, timeout: float, what: str, interval: float = 0.1) -> None:
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


@dataclass
class RoleProcess:
    """One role under gunicorn on 127.0.0.1:port (`app`: the WSGI module, for test and bench
    apps that run under the same gunicorn config; ready = 200 on /health/ready)."""

    role: str
    port: int
    env: dict[str, str]
    logfile: Path
    process: subprocess.Popen | None = None
    app: str = "settings.wsgi"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, *, wait: bool = True, timeout: float = 60) -> RoleProcess:
        self.logfile.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.logfile, "ab")  # noqa: SIM115
        env = {**os.environ, **self.env, "ROLE": self.role, "PORT": str(self.port)}
        self.process = subprocess.Popen(
            [
                PYTHON,
                "-m",
                "gunicorn",
                "-c",
                str(PROJECT / "settings" / "gunicorn.py"),
                self.app,
            ],
            cwd=PROJECT,
            env=env,
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


# --------------------------------------------------------------------------- make up / down


def _run_dir() -> Path:
    return Path(os.environ.get("DLOCK_RUN_DIR", PROJECT / ".run"))


def _secret(run_dir: Path) -> str:
    path = run_dir / "secret_key"
    if not path.exists():
        path.write_text(secrets.token_urlsafe(48))
        path.chmod(0o600)
    return path.read_text().strip()


def _read_env(path: Path) -> dict[str, str]:
    values: dict[str, str] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if "=" in line and not line.startswith("#"):
                key, value = line.split("=", 1)
                values[key] = value
    return values


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def up(backend: str = "pg") -> dict[str, str]:
    run_dir = _run_dir()
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    (run_dir / "pids").mkdir(parents=True, exist_ok=True)
    previous = _read_env(run_dir / "stack.env")
    env: dict[str, str] = {
        "DJANGO_SECRET_KEY": _secret(run_dir),
        "LOCK_BACKEND": backend,
        "DJANGO_ALLOWED_HOSTS": "127.0.0.1,localhost",
    }
    # --- issue 15 (credentials): one executor and one operator credential per stack, kept
    # across `make up`; the roles get only their hashes, stack.env the plaintexts (below).
    credentials = {
        var: previous.get(var) or new_credential()
        for var in ("DLOCK_EXECUTOR_CREDENTIAL", "DLOCK_OPERATOR_CREDENTIAL")
    }
    env["DLOCK_CREDENTIALS"] = ",".join(
        [
            credentials_entry(credentials["DLOCK_EXECUTOR_CREDENTIAL"], "executor"),
            credentials_entry(credentials["DLOCK_OPERATOR_CREDENTIAL"], "operator"),
        ]
    )
    # --- end issue 15
    given = {name: os.environ.get(var) for name, var in DB_URL_ENV.items()}
    cluster: PgCluster | None = None
    if any(given.values()) and not all(given.values()):
        missing = sorted(DB_URL_ENV[name] for name, url in given.items() if not url)
        raise StackError(
            "give all three database URLs or none (then a private cluster is started); "
            f"missing: {', '.join(missing)}"
        )
    if all(given.values()):
        say("using the database URLs from the environment")
        env.update({DB_URL_ENV[name]: url for name, url in given.items()})  # type: ignore[misc]
    else:
        port = int(previous.get("DLOCK_PG_PORT") or 0) or free_port()
        cluster = PgCluster(private_datadir(run_dir), port)
        say(f"PostgreSQL cluster at {cluster.datadir} on 127.0.0.1:{port}")
        cluster.start()
        for name in DATABASES:
            env[DB_URL_ENV[name]] = cluster.create_database(name)
        env["DLOCK_PG_PORT"] = str(port)
        env["DLOCK_PG_DATADIR"] = str(cluster.datadir)
    if backend == "etcd":
        etcd_port = int(previous.get("DLOCK_ETCD_PORT") or 0) or free_port()
        env["ETCD_URL"] = f"http://127.0.0.1:{etcd_port}"
        env["DLOCK_ETCD_PORT"] = str(etcd_port)
        if not _etcd_healthy(env["ETCD_URL"]):
            etcd = EtcdServer(private_datadir(run_dir, "etcd"), etcd_port, free_port())
            etcd.start()
            (run_dir / "pids" / "etcd.pid").write_text(str(etcd.process.pid))
        say(f"etcd on {env['ETCD_URL']}")
    for role, port in DEFAULT_PORTS.items():
        env[URL_ENV[role]] = f"http://127.0.0.1:{port}"
    say("migrating lockdb, paydb, raildb")
    migrate_all(env)
    for role, port in DEFAULT_PORTS.items():
        pidfile = run_dir / "pids" / f"{role}.pid"
        if pidfile.exists() and _pid_alive(int(pidfile.read_text())) and ready(env[URL_ENV[role]]):
            say(f"{role} already running on {env[URL_ENV[role]]}")
            continue
        if port_open(port):
            raise StackError(f"port {port} is taken by another process; free it or run `make down`")
        proc = RoleProcess(role, port, env, run_dir / "logs" / f"{role}.log").start(wait=False)
        pidfile.write_text(str(proc.process.pid))
    for role in DEFAULT_PORTS:
        wait_until(lambda r=role: ready(env[URL_ENV[r]]), timeout=60, what=f"{role} ready")
        say(f"{role:<11} ready on {env[URL_ENV[role]]}")
    env.update(credentials)  # issue 15: callers read DLOCK_{EXECUTOR,OPERATOR}_CREDENTIAL
    lines = [f"{key}={value}" for key, value in sorted(env.items()) if key != "DJANGO_SECRET_KEY"]
    lines.append(f"DJANGO_SECRET_KEY={env['DJANGO_SECRET_KEY']}")
    (run_dir / "stack.env").write_text("\n".join(lines) + "\n")
    (run_dir / "stack.env").chmod(0o600)  # issue 15: it holds the plaintext credentials
    say(f"wrote {run_dir / 'stack.env'}")
    return env


def down() -> None:
    run_dir = _run_dir()
    pids = run_dir / "pids"
    for pidfile in sorted(pids.glob("*.pid")) if pids.exists() else []:
        pid = int(pidfile.read_text() or 0)
        if pid and _pid_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGTERM)
            deadline = time.monotonic() + 15
            while _pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)
            if _pid_alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
            say(f"stopped {pidfile.stem} (pid {pid})")
        pidfile.unlink()
    env = _read_env(run_dir / "stack.env")
    if env.get("DLOCK_PG_DATADIR"):
        cluster = PgCluster(Path(env["DLOCK_PG_DATADIR"]), int(env["DLOCK_PG_PORT"]))
        if cluster.initialised() and cluster.running():
            cluster.stop()
            say("stopped PostgreSQL")
    say("stack is down")


def status() -> int:
    env = _read_env(_run_dir() / "stack.env")
    if not env:
        say("no stack (run `make up`)")
        return 1
    healthy = True
    for role in DEFAULT_PORTS:
        url = env.get(URL_ENV[role], "")
        state = "ready" if url and ready(url) else "DOWN"
        healthy &= state == "ready"
        say(f"{role:<11} {url:<24} {state}")
    return 0 if healthy else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dlock.devstack")
    parser.add_argument("command", choices=["up", "down", "status"])
    parser.add_argument(
        "--backend", default=os.environ.get("LOCK_BACKEND", "pg"), choices=["pg", "etcd"]
    )
    args = parser.parse_args(argv)
    try:
        if args.command == "up":
            env = up(args.backend)
            say("stack is up:")
            for role in DEFAULT_PORTS:
                say(f"  {URL_ENV[role]:<16} {env[URL_ENV[role]]}")
            return 0
        if args.command == "down":
            down()
            return 0
        return status()
    except (StackError, subprocess.CalledProcessError) as exc:
        say(f"error: {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
