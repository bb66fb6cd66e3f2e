"""`make up / down / status / clean` and restarting one role of the running stack.

Steps of `up`: read what is running (the role records under `.run/roles/`) → refuse a request
for another topology (backend, etcd members, replicas, ports, databases) → PostgreSQL (a private
cluster unless the three database URLs are given) → etcd when LOCK_BACKEND=etcd → migrate →
start the roles that are not running, recording each one's argv and environment → wait until
every role is ready → write `.run/stack.env` (only now, and only what the processes run with).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devstack.common import (
    DATABASES,
    DB_URL_ENV,
    DEFAULT_PORTS,
    REPLICA_PORT_STEP,
    REPLICATED_ROLES,
    ROLES,
    URL_ENV,
    StackError,
    free_port,
    pid_alive,
    port_open,
    ready,
    say,
    terminate_all,
    wait_until,
)
from devstack.envfile import (
    proof_keys,
    public_keys_of,
    read_env,
    run_dir,
    secret_key,
    write_env,
)
from devstack.etcd import etcd_cluster, etcd_healthy
from devstack.liveness import plan, wait_alive
from devstack.postgres import PgCluster, private_datadir, state_root
from devstack.roles import RoleProcess, migrate_all, read_record, remove_pod_dir, write_record
from devstack.secrets_env import role_environment, stack_file_env
from devstack.tls import ensure_tls, stack_tls
from dlock.auth import credentials_entry, new_credential


class TopologyMismatch(StackError):
    """`up` was asked for a stack other than the one running."""


@dataclass(frozen=True)
class Topology:
    backend: str = "pg"
    etcd_members: int = 1
    replicas: int = 1
    databases: str = "private"  # or "external": the three URLs came from the environment
    ports: tuple[tuple[str, int], ...] = tuple(DEFAULT_PORTS.items())

    def describe(self) -> str:
        words = [f"LOCK_BACKEND={self.backend}"]
        if self.backend == "etcd":
            words.append(f"ETCD_MEMBERS={self.etcd_members}")
        words.append(f"REPLICAS={self.replicas}")
        if self.databases != "private":
            words.append(f"databases={self.databases}")
        if dict(self.ports) != DEFAULT_PORTS:
            words.append("ports=" + ",".join(f"{r}:{p}" for r, p in self.ports))
        return " ".join(words)

    @classmethod
    def of(cls, env: dict[str, str]) -> Topology:
        """The topology a stack env describes (an env written before topologies: defaults)."""
        ports = tuple(
            (role, int(env[URL_ENV[role]].split(",")[0].rsplit(":", 1)[1]))
            if env.get(URL_ENV[role])
            else (role, DEFAULT_PORTS[role])
            for role in ROLES
        )
        return cls(
            backend=env.get("LOCK_BACKEND", "pg"),
            etcd_members=int(env.get("DLOCK_ETCD_MEMBERS") or 1),
            replicas=int(env.get("DLOCK_REPLICAS") or 1),
            databases="private" if env.get("DLOCK_PG_DATADIR") else "external",
            ports=ports,
        )


def instances(topology: Topology) -> list[tuple[str, str, int]]:
    """(instance name, role, port): replica n of a role is `<role>-n` on its port + 100·(n−1)."""
    ports = dict(topology.ports)
    result = []
    for role in ROLES:
        count = topology.replicas if role in REPLICATED_ROLES else 1
        for n in range(1, count + 1):
            name = role if n == 1 else f"{role}-{n}"
            result.append((name, role, ports[role] + REPLICA_PORT_STEP * (n - 1)))
    return result


# --------------------------------------------------------------------------- what is running


def _records(run: Path) -> dict[str, dict[str, Any]]:
    folder = run / "roles"
    found = {}
    for path in sorted(folder.glob("*.json")) if folder.exists() else []:
        record = read_record(path)
        if record:
            found[record["name"]] = record
    return found


def running_records(run: Path) -> dict[str, dict[str, Any]]:
    """The role records whose process is alive: what the running stack was started with."""
    return {name: r for name, r in _records(run).items() if pid_alive(int(r.get("pid") or 0))}


def running_env(run: Path) -> dict[str, str] | None:
    """The stack env the running roles were started with (None: nothing is running)."""
    for record in running_records(run).values():
        return dict(record["stack_env"])
    pids = run / "pids"
    alive = [p for p in pids.glob("*.pid") if _pid_from(p) and pid_alive(_pid_from(p))]
    if pids.exists() and alive:
        return read_env(run / "stack.env")  # a stack started before role records existed
    return None


def _pid_from(pidfile: Path) -> int:
    try:
        return int(pidfile.read_text() or 0)
    except (FileNotFoundError, ValueError):
        return 0


def resolve(
    running: dict[str, str] | None,
    *,
    backend: str | None,
    etcd_members: int | None,
    replicas: int | None,
    ports: dict[str, int] | None,
    databases: str,
) -> Topology:
    """What to run: each unspecified part is the running stack's, else the default. A request
    that disagrees with a running stack is refused, naming the running one and how to switch."""
    current = Topology.of(running) if running is not None else None
    base = current or Topology()
    wanted_backend = backend or base.backend
    if etcd_members and wanted_backend != "etcd":
        raise StackError("ETCD_MEMBERS needs LOCK_BACKEND=etcd")
    members = 1
    if wanted_backend == "etcd":
        members = etcd_members or (base.etcd_members if base.backend == "etcd" else 1)
    wanted = Topology(
        backend=wanted_backend,
        etcd_members=members,
        replicas=replicas or base.replicas,
        databases=databases,
        ports=tuple(ports.items()) if ports else base.ports,
    )
    if current is not None and wanted != current:
        raise TopologyMismatch(
            f"a stack is already running with {current.describe()}; you asked for "
            f"{wanted.describe()}. Nothing was changed (.run/stack.env still describes the "
            "running stack). To switch: `make down`, then `make up` with the new settings "
            f"(e.g. `make down && make up LOCK_BACKEND={wanted.backend}`); to use the running "
            "stack, run `make up` without LOCK_BACKEND/ETCD_MEMBERS/REPLICAS."
        )
    return wanted


# --------------------------------------------------------------------------- up


def _databases(env: dict[str, str], previous: dict[str, str], run: Path) -> None:
    given = {name: os.environ.get(var) for name, var in DB_URL_ENV.items()}
    if all(given.values()):
        say("using the database URLs from the environment")
        env.update({DB_URL_ENV[name]: str(url) for name, url in given.items()})
        return
    port = int(previous.get("DLOCK_PG_PORT") or 0) or free_port()
    # TLS=1: the cluster speaks TLS only, URLs verify it (sslmode=verify-full, the stack's CA)
    tls = stack_tls(run, env)
    cluster = PgCluster(private_datadir(run), port, tls=tls)
    say(f"PostgreSQL cluster at {cluster.datadir} on 127.0.0.1:{port}")
    cluster.start()
    for name in DATABASES:
        env[DB_URL_ENV[name]] = cluster.create_database(name)
    env["DLOCK_PG_PORT"] = str(port)
    env["DLOCK_PG_DATADIR"] = str(cluster.datadir)


def database_source() -> str:
    given = [os.environ.get(var) for var in DB_URL_ENV.values()]
    if any(given) and not all(given):
        missing = sorted(var for var in DB_URL_ENV.values() if not os.environ.get(var))
        raise StackError(
            "give all three database URLs or none (then a private cluster is started); "
            f"missing: {', '.join(missing)}"
        )
    return "external" if all(given) else "private"


def _client_cert(env: dict[str, str]) -> tuple[str, str] | None:
    if env.get("DLOCK_CLIENT_CERT") and env.get("DLOCK_CLIENT_KEY"):
        return (env["DLOCK_CLIENT_CERT"], env["DLOCK_CLIENT_KEY"])
    return None


def _etcd_ports(previous: dict[str, str], members: int) -> list[tuple[int, int]]:
    pairs = [
        (int(c), int(p))
        for c, p in (
            pair.split(":")
            for pair in previous.get("DLOCK_ETCD_PORTS", "").split(",")
            if ":" in pair
        )
    ]
    if len(pairs) == members:
        return pairs
    return [(free_port(), free_port()) for _ in range(members)]


def _etcd(env: dict[str, str], previous: dict[str, str], run: Path, members: int) -> None:
    ports = _etcd_ports(previous, members)
    # TLS=1: https to etcd, which verifies its clients (the lock server's DLOCK_CLIENT_CERT)
    tls = stack_tls(run, env)
    cluster = etcd_cluster(state_root(run), ports, tls=tls)
    if tls:
        env["DLOCK_CLIENT_CERT"] = str(tls.client_certificate)
        env["DLOCK_CLIENT_KEY"] = str(tls.client_key)
    started = []
    for member in cluster:
        if not etcd_healthy(member.url, ca=env.get("DLOCK_CA_BUNDLE"), cert=_client_cert(env)):
            member.start(wait=False)
            (run / "pids" / f"{member.datadir.name}.pid").write_text(str(member.process.pid))
            started.append(member)
    for member in cluster:
        member.wait_healthy()  # a cluster is healthy once a quorum of members is up
    env["ETCD_URL"] = ",".join(member.url for member in cluster)
    env["DLOCK_ETCD_PORTS"] = ",".join(f"{c}:{p}" for c, p in ports)
    env["DLOCK_ETCD_MEMBERS"] = str(members)
    say(f"etcd on {env['ETCD_URL']}" + (f" (started {len(started)})" if started else ""))


def _start_roles(
    env: dict[str, str], topology: Topology, run: Path, running: dict[str, dict[str, Any]]
) -> None:
    procs: list[RoleProcess] = []
    alive: list[tuple[str, int]] = []
    for name, role, port in instances(topology):
        scheme = "https" if env.get("DLOCK_TLS") == "1" else "http"
        ca = env.get("DLOCK_CA_BUNDLE")
        action = plan(name, port, running, scheme=scheme, ca=ca)
        if action == "ready":
            say(f"{name} already running on {scheme}://127.0.0.1:{port}")
            continue
        if action == "alive":
            alive.append((name, port))
            continue
        tls = (env["DLOCK_TLS_CERT"], env["DLOCK_TLS_KEY"]) if scheme == "https" else None
        proc = RoleProcess(
            role,
            port,
            role_environment(role, env),
            run / "logs" / f"{name}.log",
            name=name,
            inherit_environ=False,
            tls=tls,
        )
        if action == "replace":  # its process exists but answers nothing: replace it, as it was
            _terminate(int(running[name]["pid"]))
            wait_until(lambda p=port: not port_open(p), timeout=15, what=f"port {port} to free")
            proc = RoleProcess.from_record(running[name])
        if port_open(port):
            raise StackError(f"port {port} is taken by another process; free it or run `make down`")
        procs.append(proc.start(wait=False))
        _remember(run, proc, env)
    for proc in procs:
        proc.wait_ready()
    scheme = "https" if env.get("DLOCK_TLS") == "1" else "http"
    wait_alive(alive, run, scheme=scheme, ca=env.get("DLOCK_CA_BUNDLE"))
    for name, _role, port in instances(topology):
        say(f"{name:<13} ready on {scheme}://127.0.0.1:{port}")


def _remember(run: Path, proc: RoleProcess, stack_env: dict[str, str]) -> None:
    record = {**proc.record(), "stack_env": stack_file_env(stack_env)}
    write_record(run / "roles" / f"{proc.instance}.json", record)
    (run / "pids" / f"{proc.instance}.pid").write_text(str(proc.process.pid))


def _tls(env: dict[str, str], run: Path, tls: bool | None) -> str:
    """Set (or clear) the TLS settings of the stack's env; the URL scheme. None: as running."""
    if tls is None:
        tls = env.get("DLOCK_TLS") == "1"
    if not tls:
        for var in (
            "DLOCK_TLS",
            "DLOCK_CA_BUNDLE",
            "DLOCK_TLS_CERT",
            "DLOCK_TLS_KEY",
            "DLOCK_CLIENT_CERT",
            "DLOCK_CLIENT_KEY",
        ):
            env.pop(var, None)
        return "http"
    files = ensure_tls(run / "tls")
    env |= {
        "DLOCK_TLS": "1",
        "DLOCK_CA_BUNDLE": str(files.ca),
        "DLOCK_TLS_CERT": str(files.certificate),
        "DLOCK_TLS_KEY": str(files.key),
    }
    return "https"


def up(
    backend: str | None = None,
    *,
    etcd_members: int | None = None,
    replicas: int | None = None,
    ports: dict[str, int] | None = None,
    run: Path | str | None = None,
    tls: bool | None = None,
) -> dict[str, str]:
    """Start the stack (or the parts of it that are not running); return its env.

    `tls`: every role's proxy speaks https with a certificate of a throwaway CA made under
    `.run/tls/` (devstack.tls); DLOCK_CA_BUNDLE names the CA. None: what is running, else off.

    None means "what is running, else the default" (pg, 1 member, 1 replica, 8081–8084)."""
    run = run_dir(run)
    for folder in ("logs", "pids", "roles"):
        (run / folder).mkdir(parents=True, exist_ok=True)
    running = running_env(run)
    topology = resolve(
        running,
        backend=backend,
        etcd_members=etcd_members,
        replicas=replicas,
        ports=ports,
        databases=database_source(),
    )
    previous = running if running is not None else read_env(run / "stack.env")
    env: dict[str, str] = dict(running or {})  # a running stack keeps every value it runs with
    env |= {
        "DJANGO_SECRET_KEY": secret_key(run),
        "DLOCK_PROOF_KEYS": proof_keys(run),
        # no secret: the verifiers' (payment resource, rail proxy, an adopter's) and stack.env's
        "DLOCK_FENCING_PUBLIC_KEYS": public_keys_of(proof_keys(run)),
        "LOCK_BACKEND": topology.backend,
        "DJANGO_ALLOWED_HOSTS": "127.0.0.1,localhost",
        "DLOCK_REPLICAS": str(topology.replicas),
    }
    # Credentials: one executor and one operator credential per stack, kept
    # across `make up` (else the caller's, else new); the roles get only their hashes,
    # stack.env the plaintexts (below).
    stored = read_env(run / "stack.env")  # the roles' environment holds only the hashes
    credentials = {
        var: stored.get(var) or os.environ.get(var) or new_credential()
        for var in ("DLOCK_EXECUTOR_CREDENTIAL", "DLOCK_OPERATOR_CREDENTIAL")
    }
    for var in credentials:
        env.pop(var, None)
    env["DLOCK_CREDENTIALS"] = ",".join(
        [
            credentials_entry(credentials["DLOCK_EXECUTOR_CREDENTIAL"], "executor"),
            credentials_entry(credentials["DLOCK_OPERATOR_CREDENTIAL"], "operator"),
        ]
    )
    scheme = _tls(env, run, tls)
    _databases(env, previous, run)
    if topology.backend == "etcd":
        _etcd(env, previous, run, topology.etcd_members)
    by_role: dict[str, list[str]] = {}
    for _name, role, port in instances(topology):
        by_role.setdefault(role, []).append(f"{scheme}://127.0.0.1:{port}")
    env.update({URL_ENV[role]: ",".join(urls) for role, urls in by_role.items()})
    say("migrating lockdb, paydb, raildb")
    migrate_all(env)
    _start_roles(env, topology, run, running_records(run))
    env.update(credentials)  # callers read DLOCK_{EXECUTOR,OPERATOR}_CREDENTIAL
    write_env(run / "stack.env", stack_file_env(env))
    say(f"wrote {run / 'stack.env'} ({topology.describe()})")
    return env


# --------------------------------------------------------------------------- restart / down


def _terminate(pid: int, timeout: float = 15) -> None:
    """SIGTERM the process (a role's pod drains its nginx, then its gunicorn), SIGKILL its
    process group after `timeout`; reaps our own children."""
    terminate_all([pid], timeout)


def restart_role(name: str, *, run: Path | str | None = None, timeout: float = 60) -> RoleProcess:
    """Stop one role instance of the running stack and start it again with exactly the argv
    and environment it was started with (its record), whatever stack.env or the caller's
    environment say now."""
    run = run_dir(run)
    record = read_record(run / "roles" / f"{name}.json")
    if record is None:
        raise StackError(f"no record of {name} under {run / 'roles'}: start it with `make up`")
    _terminate(int(record.get("pid") or 0), timeout=20)
    port = int(record["port"])
    wait_until(lambda: not port_open(port), timeout=15, what=f"port {port} to free")
    proc = RoleProcess.from_record(record).start(wait=False)
    _remember(run, proc, record["stack_env"])  # before waiting: `make down` finds it either way
    proc.wait_ready(timeout)
    return proc


def down(*, run: Path | str | None = None) -> None:
    run = run_dir(run)
    env = running_env(run) or read_env(run / "stack.env")
    pids = run / "pids"
    pidfiles = sorted(pids.glob("*.pid")) if pids.exists() else []
    # The roles first, all at once; then what they ran on (etcd members), all at once.
    roles = (
        {path.stem for path in (run / "roles").glob("*.json")}
        if (run / "roles").exists()
        else set()
    )
    for wave in (
        [p for p in pidfiles if p.stem in roles],
        [p for p in pidfiles if p.stem not in roles],
    ):
        alive = {path: pid for path in wave if (pid := _pid_from(path)) and pid_alive(pid)}
        terminate_all(list(alive.values()))
        for pidfile in wave:
            if pidfile in alive:
                say(f"stopped {pidfile.stem} (pid {alive[pidfile]})")
            pidfile.unlink()
    for record in (run / "roles").glob("*.json") if (run / "roles").exists() else []:
        pod_dir = (read_record(record) or {}).get("pod_dir")
        if pod_dir:
            remove_pod_dir(Path(pod_dir))
        record.unlink()
    if env.get("DLOCK_PG_DATADIR"):
        cluster = PgCluster(Path(env["DLOCK_PG_DATADIR"]), int(env["DLOCK_PG_PORT"]))
        if cluster.initialised() and cluster.running():
            cluster.stop()
            say("stopped PostgreSQL")
    say("stack is down")


def clean(*, run: Path | str | None = None) -> list[Path]:
    """`down`, then remove everything `up` created: the run directory and, wherever they live,
    the PostgreSQL cluster and etcd data (as root: /tmp/dlock-<hash of the run dir>/)."""
    run = run_dir(run)
    env = read_env(run / "stack.env")
    down(run=run)
    targets = [run, state_root(run, as_root=True), state_root(run, as_root=False)]
    if env.get("DLOCK_PG_DATADIR"):
        targets.append(Path(env["DLOCK_PG_DATADIR"]))
    removed = []
    for path in dict.fromkeys(targets):
        if not path.exists():
            continue
        try:
            shutil.rmtree(path)
        except PermissionError as exc:
            raise StackError(f"cannot remove {path} ({exc}); remove it as its owner") from exc
        removed.append(path)
        say(f"removed {path}")
    return removed


def status(*, run: Path | str | None = None) -> int:
    run = run_dir(run)
    env = running_env(run) or read_env(run / "stack.env")
    if not env:
        say("no stack (run `make up`)")
        return 1
    topology = Topology.of(env)
    say(f"stack: {topology.describe()}")
    healthy = True
    scheme = "https" if env.get("DLOCK_TLS") == "1" else "http"
    for name, _role, port in instances(topology):
        url = f"{scheme}://127.0.0.1:{port}"
        state = "ready" if ready(url, env.get("DLOCK_CA_BUNDLE")) else "DOWN"
        healthy &= state == "ready"
        say(f"{name:<13} {url:<24} {state}")
    if env.get("ETCD_URL"):
        for url in env["ETCD_URL"].split(","):
            healthy = etcd_healthy(url, ca=env.get("DLOCK_CA_BUNDLE"), cert=_client_cert(env))
            say(f"{'etcd':<13} {url:<24} {'healthy' if healthy else 'DOWN'}")
    return 0 if healthy else 1
