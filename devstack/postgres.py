"""A private PostgreSQL cluster for the stack and the tests (initdb/pg_ctl, trust auth).

Given TLS files (`make up TLS=1`), the cluster serves TLS only on TCP (pg_hba `hostssl`; a
clear-text connection is refused) with the stack's server certificate, and its URLs carry
`sslmode=verify-full` and `sslrootcert` = the stack's CA, as the Kubernetes manifests do."""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os
import pwd
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from devstack.common import StackError
from devstack.tls import TlsFiles


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


def unprivileged_user() -> str | None:
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


_TLS_HBA_MARK = "# make up TLS=1 (devstack/postgres.py): TLS only over TCP"


@dataclass
class PgCluster:
    """A throwaway PostgreSQL cluster on 127.0.0.1:port, trust auth, superuser `postgres`."""

    datadir: Path
    port: int
    fast: bool = False  # fsync off: for tests only, never for numbers that claim durability
    user: str | None = field(default_factory=unprivileged_user)
    # More `-c name=value` settings (bench: pg_stat_statements); never fsync/synchronous_commit.
    settings: tuple[str, ...] = ()
    tls: TlsFiles | None = None

    @property
    def logfile(self) -> Path:
        return self.datadir / "server.log"

    def url(self, dbname: str) -> str:
        url = f"postgres://postgres@127.0.0.1:{self.port}/{dbname}"
        if self.tls:
            url += f"?sslmode=verify-full&sslrootcert={self.tls.ca}"
        return url

    def initialised(self) -> bool:
        return (self.datadir / "PG_VERSION").exists()

    def _pg_ctl(self, *args: str, check: bool) -> subprocess.CompletedProcess:
        return subprocess.run(
            _as_user([str(pg_bindir() / "pg_ctl"), "-D", str(self.datadir), *args], self.user),
            cwd="/",
            check=check,
            stdout=subprocess.DEVNULL,
            stderr=None if check else subprocess.DEVNULL,
        )

    def init(self) -> None:
        if self.initialised():
            return
        self.datadir.mkdir(parents=True, exist_ok=True)
        if self.user:
            _chown_tree(self.datadir, self.user)
        initdb = [str(pg_bindir() / "initdb"), "-D", str(self.datadir), "-U", "postgres"]
        subprocess.run(
            _as_user([*initdb, "--auth=trust", "--encoding=UTF8", "--locale=C"], self.user),
            cwd="/",
            check=True,
            stdout=subprocess.DEVNULL,
        )

    def running(self) -> bool:
        return self._pg_ctl("status", check=False).returncode == 0

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
        options += [f"-c {setting}" for setting in self.settings]
        options += self._tls_options()
        self._pg_ctl(
            "-l", str(self.logfile), "-w", "-t", "60", "-o", " ".join(options), "start", check=True
        )

    def _tls_options(self) -> list[str]:
        """ssl=on with copies of the stack's certificate the server's user owns (PostgreSQL
        refuses a key others can read), and TCP connections without TLS refused."""
        hba = self.datadir / "pg_hba.conf"
        if not self.tls:
            if hba.exists() and hba.read_text().startswith(_TLS_HBA_MARK):  # TLS=1 before
                hba.write_text("local all all trust\nhost all all 127.0.0.1/32 trust\n")
            return []
        for source, name in ((self.tls.certificate, "tls.crt"), (self.tls.key, "tls.key")):
            target = self.datadir / name
            shutil.copyfile(source, target)
            target.chmod(0o600)
            if self.user:
                entry = pwd.getpwnam(self.user)
                os.chown(target, entry.pw_uid, entry.pw_gid)
        hba.write_text(
            f"{_TLS_HBA_MARK}\n"
            "local all all trust\n"
            "hostssl all all 127.0.0.1/32 trust\n"
            "hostnossl all all 0.0.0.0/0 reject\n"
        )
        return [
            "-c ssl=on",
            f"-c ssl_cert_file={self.datadir / 'tls.crt'}",
            f"-c ssl_key_file={self.datadir / 'tls.key'}",
            "-c ssl_min_protocol_version=TLSv1.2",
        ]

    def stop(self, mode: str = "fast") -> None:
        if not self.initialised() or not self.running():
            return
        self._pg_ctl("-m", mode, "-w", "stop", check=False)

    def restart(self, mode: str = "fast") -> None:
        """`pg_ctl restart -m mode`: every session is closed, the server is back (same options)
        when this returns."""
        self._pg_ctl("-m", mode, "-w", "-t", "60", "-l", str(self.logfile), "restart", check=True)

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


def state_root(run_dir: Path, *, as_root: bool | None = None) -> Path:
    """Where the stack keeps its databases: `run_dir`, or as root /tmp/dlock-<hash of run_dir>
    (the cluster then runs as `postgres`, which must be able to reach its data directory)."""
    if as_root is None:
        as_root = os.geteuid() == 0
    if as_root:
        digest = hashlib.sha256(str(run_dir.resolve()).encode()).hexdigest()[:10]
        return Path("/tmp") / f"dlock-{digest}"  # noqa: S108 - root-only, postgres-owned
    return run_dir


def private_datadir(run_dir: Path, name: str = "pg", *, as_root: bool | None = None) -> Path:
    return state_root(run_dir, as_root=as_root) / name
