"""The image itself, built by podman from this checkout, starts every role (issue 24).

Each server role runs as its pod does in k8s/: the dlock container (the image's entrypoint,
gunicorn on 127.0.0.1:<upstream> as GUNICORN_BIND says in the manifests, the pod's securityContext:
read-only root, /tmp a tmpfs, no capabilities) behind an nginx rendered from the one template
(devstack.proxy) on the pod's port. That nginx is the host's: the proxy sidecar's image cannot be
pulled here either, and its configuration, not its packaging, is what the pod serves through.
`devstack.pod` runs both, so stopping the role drains nginx, then the container (podman run
passes SIGTERM to its PID 1). Every role answers /health/ready 200 through its proxy and runs as
uid 10001; the migrate Job's own command (k8s/reconciler.yaml) migrates fresh databases first,
and the executor (`--until-idle`) pays seeded payouts through the pods. The databases are on a
cluster that speaks TLS only (tests.conftest.tls_postgres); every container reads its CA
read-only where k8s mounts Secret `dlock-db-ca` and its URLs say `sslmode=verify-full` with
`sslrootcert` there, as k8s/config.yaml's do: the image refuses any other URL.

Skipped with the reason when podman is absent or the Dockerfile's base image is not on this
machine: `scripts/base-image.sh` pulls it, or builds a stand-in where no registry answers.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import resource
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest
import requests
import yaml

from devstack.common import DB_URL_ENV, PROJECT, URL_ENV, free_port
from devstack.envfile import new_proof_keys, public_keys_of
from devstack.proxy import ProxyConfig
from devstack.roles import RoleProcess
from devstack.secrets_env import role_environment
from dlock.roles import SERVICE_NAMES
from tests import credentials
from tests.conftest import create_live_databases

# The first test's setup builds the image (a minute or more on a 2-core machine).
pytestmark = [pytest.mark.live, pytest.mark.slow, pytest.mark.timeout(1800)]

BASE_SCRIPT = "scripts/base-image.sh"
SERVER_ROLES = ("lockserver", "payments", "railproxy", "railstub")
SERVICE_UID = "10001"
# The host's trust store: where egress is TLS-intercepted, pip in the build trusts what the
# host trusts. Mounted for the build's RUN steps only, never written into a layer.
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
# As the manifests' securityContext: read-only root, a private /tmp, no capabilities.
POD_SECURITY = [
    "--read-only",
    "--tmpfs",
    "/tmp",  # the container's own tmpfs, as the pods' emptyDir
    "--cap-drop",
    "all",
    "--security-opt",
    "no-new-privileges",
]

PROOF_KEYS = new_proof_keys()
# Where k8s mounts Secret `dlock-db-ca`'s ca.crt (k8s/*.yaml), the path the URLs' sslrootcert
# names inside every container.
DB_CA_IN_POD = "/etc/dlock-db-ca/ca.crt"


def podman(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout)


def base_image() -> str:
    for line in (PROJECT / "Dockerfile").read_text().splitlines():
        if line.startswith("FROM "):
            return line.split()[1]
    raise AssertionError("the Dockerfile has no FROM")


def skip_reason() -> str | None:
    if shutil.which("podman") is None:
        return "no container engine (podman) on this machine"
    try:
        info = podman("info", timeout=60)
    except subprocess.TimeoutExpired:
        return "podman does not answer (`podman info` timed out)"
    if info.returncode != 0:
        return f"podman does not answer: {info.stderr.strip()[:300]}"
    if podman("image", "exists", base_image(), timeout=60).returncode != 0:
        return (
            f"the Dockerfile's base image {base_image()} is not on this machine: "
            f"`bash {BASE_SCRIPT}` pulls it, or builds a stand-in where no registry answers"
        )
    return None


def host_ulimits() -> list[str]:
    """The container's open-file and process limits within this process's hard limits.

    podman asks the runtime for nofile=1048576 (and its own nproc); where this process may not
    raise a limit (no CAP_SYS_RESOURCE, e.g. inside another sandbox) the runtime's setrlimit
    fails with "Operation not permitted". Lowering a limit needs no privilege."""
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nproc = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    nofile = 1_048_576 if nofile == resource.RLIM_INFINITY else min(nofile, 1_048_576)
    # uid 10001 is every container's user: a few hundred threads across the pods.
    nproc = 4096 if nproc == resource.RLIM_INFINITY else min(nproc, 4096)
    return ["--ulimit", f"nofile={nofile}:{nofile}", "--ulimit", f"nproc={nproc}:{nproc}"]


def engine_flags(image: str) -> tuple[list[str], list[str]]:
    """The least podman needs on this host to run a container, found by trying: nothing; the
    host's limits (host_ulimits); runc instead of crun (crun refuses a cgroup v1+v2 "hybrid"
    host: "cgroups in hybrid mode not supported"); both. Returns the flags and what each failed
    attempt said; no flags when nothing works."""
    candidates = [[], host_ulimits(), ["--runtime", "runc"], ["--runtime", "runc", *host_ulimits()]]
    failures: list[str] = []
    for flags in candidates:
        if flags[:2] == ["--runtime", "runc"] and shutil.which("runc") is None:
            failures.append(f"{flags}: runc is not installed (apt-get install runc)")
            continue
        tried = podman("run", "--rm", "--network", "host", *flags, image, "true")
        if tried.returncode == 0:
            return flags, failures
        failures.append(f"{flags}: {tried.stderr.strip()[-300:]}")
    return [], failures


def build_flags(run_flags: list[str]) -> list[str]:
    """podman build's RUN steps start containers as podman run does (the same runtime and
    limits), on the host's network (PyPI), with the host's trust store mounted over the base's
    for those steps only: where egress is TLS-intercepted, the build's pip (Debian's, in the
    stand-in, reads the system store) trusts what the host trusts, and no layer keeps it. A
    mounted file that exists in the base leaves nothing behind; a new path would leave an
    empty file. `--format docker` keeps the HEALTHCHECK (the OCI format drops it)."""
    flags = [*run_flags, "--network", "host", "--format", "docker"]
    if HOST_CA_BUNDLE.exists():
        flags += ["--volume", f"{HOST_CA_BUNDLE}:{HOST_CA_BUNDLE}:ro"]
    return flags


@dataclass
class Built:
    tag: str
    run_flags: list[str]
    stand_in: bool
    db_ca: Path  # the TLS cluster's CA on this host

    def pod_flags(self) -> list[str]:
        """The pods' security, the engine's flags, and the database CA mounted read-only."""
        return [*POD_SECURITY, "--volume", f"{self.db_ca}:{DB_CA_IN_POD}:ro", *self.run_flags]

    def pod_env(self, env: dict[str, str]) -> dict[str, str]:
        """`env` as a container has it: each database URL's sslrootcert the mounted CA."""
        host, pod = f"sslrootcert={self.db_ca}", f"sslrootcert={DB_CA_IN_POD}"
        return {
            key: value.replace(host, pod) if key in DB_URL_ENV.values() else value
            for key, value in env.items()
        }

    def run(self, *args: str, env: dict[str, str], timeout: float = 300):
        """A one-off container of the image (a Job, an executor), with the pods' security; its
        values from podman's environment (no secret on a command line). One that outlives
        `timeout` is removed, its log in the failure."""
        name = f"dlock-run-{os.getpid()}-{next(_runs)}"
        argv = ["podman", "run", "--rm", "--name", name, "--network", "host", *self.pod_flags()]
        argv += [*[f"--env={key}" for key in env], *args]
        try:
            return subprocess.run(
                argv,
                env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", **self.pod_env(env)},
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            log = podman("logs", name)
            podman("rm", "-f", name)
            tail = log.stdout[-3000:] + log.stderr[-3000:]
            raise AssertionError(f"{args} still running after {timeout}s:\n{tail}") from None


_runs = itertools.count()


@pytest.fixture(scope="module")
def engine() -> None:
    reason = skip_reason()
    if reason:
        pytest.skip(reason)


@pytest.fixture(scope="module")
def built(engine, tls_postgres) -> Iterator[Built]:
    base = base_image()
    run_flags, failures = engine_flags(base)
    if failures and not run_flags:
        pytest.fail("podman cannot run a container here:\n" + "\n".join(failures))
    labels = podman("image", "inspect", "--format", "{{json .Labels}}", base).stdout
    stand_in = (json.loads(labels or "null") or {}).get("dlock.base.stand-in") == "true"
    tag = f"localhost/dlock:test-{os.getpid()}"
    build = podman(
        "build", "--pull=never", *build_flags(run_flags), "-t", tag, str(PROJECT), timeout=1800
    )
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    try:
        assert tls_postgres.tls is not None
        yield Built(tag, run_flags, stand_in, tls_postgres.tls.ca)
    finally:
        podman("rmi", "-f", tag)


@dataclass
class ContainerRole(RoleProcess):
    """A role as its k8s pod runs it: nginx (the pod's port) in front of the image's container,
    whose gunicorn listens on 127.0.0.1:upstream_port (GUNICORN_BIND, as in k8s/*.yaml)."""

    image: Built | None = None
    upstream_port: int = 0
    container: str = ""
    forwarded: list[str] = field(default_factory=list)

    def environment(self) -> dict[str, str]:
        assert self.image is not None
        env = self.image.pod_env(super().environment())
        env["GUNICORN_BIND"] = f"127.0.0.1:{self.upstream_port}"
        self.forwarded = sorted(set(env) - {"PATH", "HOME"})
        return {**env, "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}  # podman's, not the container's

    def proxy_config(self, env: dict[str, str]) -> ProxyConfig:
        return dataclasses.replace(
            super().proxy_config(env), upstream=f"127.0.0.1:{self.upstream_port}"
        )

    def gunicorn(self) -> list[str]:
        """The pod's server: the container in the foreground (its values from podman's own
        environment, the pod's, so no secret is on a command line)."""
        assert self.image is not None
        return [
            shutil.which("podman") or "podman",
            "run",
            "--rm",
            "--name",
            self.container,
            "--network",
            "host",
            *self.image.pod_flags(),
            *[f"--env={key}" for key in self.forwarded],
            self.image.tag,
        ]


def _migrate_job() -> dict:
    for doc in yaml.safe_load_all((PROJECT / "k8s" / "reconciler.yaml").read_text()):
        if doc and doc["kind"] == "Job" and doc["metadata"]["name"].startswith("migrate"):
            container = doc["spec"]["template"]["spec"]["containers"][0]
            assert container["command"] == ["/bin/sh", "-c"]
            return container
    raise AssertionError("no migrate Job in k8s/reconciler.yaml")


def migrate_job_env(stack_env: dict[str, str]) -> dict[str, str]:
    """What the Job's manifest gives its container: its literal values, and each secret it
    names (secretKeyRef) with this stack's value; DLOCK_ENVIRONMENT=production is the image's."""
    env = {"DJANGO_ALLOWED_HOSTS": stack_env["DJANGO_ALLOWED_HOSTS"]}
    for var in _migrate_job()["env"]:
        env[var["name"]] = var["value"] if "value" in var else stack_env[var["name"]]
    return env


def distinct_ports(count: int) -> list[int]:
    """free_port() only probes: nothing stops two calls before anything binds from choosing
    the same port (a run here gave the lock server and the payment resource one port, and the
    lock server's readiness was answered by the payment resource's proxy)."""
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports


@pytest.fixture(scope="module")
def ports() -> dict[str, tuple[int, int]]:
    """Per role: the pod's port (its proxy) and its container's gunicorn port, all distinct."""
    chosen = distinct_ports(2 * len(SERVER_ROLES))
    return {role: (chosen[2 * i], chosen[2 * i + 1]) for i, role in enumerate(SERVER_ROLES)}


@pytest.fixture(scope="module")
def stack_env(ports, tls_postgres) -> dict[str, str]:
    return {
        "DJANGO_SECRET_KEY": os.urandom(32).hex(),
        "DLOCK_PROOF_KEYS": PROOF_KEYS,  # production refuses the development key
        "DLOCK_FENCING_PUBLIC_KEYS": public_keys_of(PROOF_KEYS),  # the verifiers'
        "LOCK_BACKEND": "pg",
        "DJANGO_ALLOWED_HOSTS": "127.0.0.1,localhost",
        "DLOCK_CREDENTIALS": credentials.CREDENTIALS,
        "DLOCK_EXECUTOR_CREDENTIAL": credentials.EXECUTOR,
        "DLOCK_OPERATOR_CREDENTIAL": credentials.OPERATOR,
        # production takes verify-full URLs only: a cluster that speaks TLS, as k8s's does
        **create_live_databases("container", tls_postgres),
        **{URL_ENV[role]: f"http://127.0.0.1:{port}" for role, (port, _) in ports.items()},
    }


@pytest.fixture(scope="module")
def migrated(built, stack_env) -> subprocess.CompletedProcess:
    """The migrate Job's command, from the image, on databases nothing has migrated yet, with
    the Job's environment as its manifest sets it (no proof ring: a migration needs none)."""
    env = migrate_job_env(stack_env)  # as the manifest has it: no key ring, no credentials
    script = _migrate_job()["args"][0]
    return built.run("--entrypoint", "/bin/sh", built.tag, "-c", script, env=env)


@pytest.fixture(scope="module")
def pods(built, ports, stack_env, migrated, tmp_path_factory) -> Iterator[dict[str, ContainerRole]]:
    assert migrated.returncode == 0, migrated.stdout[-3000:] + migrated.stderr[-3000:]
    logs = tmp_path_factory.mktemp("container-logs")
    started: dict[str, ContainerRole] = {}
    try:
        for role in SERVER_ROLES:
            port, upstream_port = ports[role]
            started[role] = ContainerRole(
                role,
                port,
                role_environment(role, stack_env, base={}),
                logs / f"{role}.log",
                inherit_environ=False,
                image=built,
                upstream_port=upstream_port,
                container=f"dlock-{role}-{os.getpid()}",
            ).start(wait=False)
        for pod in started.values():
            pod.wait_ready(timeout=180)
        yield started
    finally:
        for pod in started.values():
            pod.stop(timeout=30)
            podman("rm", "-f", pod.container)  # a container whose podman run was killed


def test_the_migrate_job_migrates_every_database_from_the_image(migrated, stack_env):
    assert migrated.returncode == 0, migrated.stdout[-3000:] + migrated.stderr[-3000:]
    for var in ("LOCK_DATABASE_URL", "PAY_DATABASE_URL", "RAIL_DATABASE_URL"):
        with psycopg.connect(stack_env[var], autocommit=True) as conn:
            applied = conn.execute("SELECT count(*) FROM django_migrations").fetchone()
        assert applied and applied[0] > 0, var


def test_the_migrate_job_as_its_manifest_configures_it_runs_from_the_image(
    built, stack_env, tls_postgres
):
    """Exactly the manifest's env: database URLs, no key ring, no credentials (a migration signs
    and verifies nothing; dlock.proof.RING_FREE_COMMANDS)."""
    env = migrate_job_env(stack_env)
    # not the stack's: this may half-migrate
    scratch = create_live_databases("container_job", tls_postgres)
    env |= {var: url for var, url in scratch.items() if var in env}
    job = built.run("--entrypoint", "/bin/sh", built.tag, "-c", _migrate_job()["args"][0], env=env)
    assert job.returncode == 0, job.stderr[-2000:]


def test_every_server_role_answers_ready_through_its_proxy_as_the_service_user(pods):
    for role, pod in pods.items():
        ready = requests.get(f"{pod.url}/health/ready", timeout=5)
        assert ready.status_code == 200, (role, ready.text)
        assert ready.json()["service"] == SERVICE_NAMES[role]  # this pod's role, no other
        user = podman("exec", pod.container, "id", "-u")
        assert user.stdout.strip() == SERVICE_UID, (role, user.stderr)
        # gunicorn is the container's PID 1 (the entrypoint execs it): SIGTERM reaches it
        pid1 = podman("exec", pod.container, "cat", "/proc/1/cmdline")
        assert "gunicorn" in pid1.stdout, (role, pid1.stdout)


def test_the_executor_from_the_image_pays_seeded_payouts_through_the_pods(built, stack_env, pods):
    seeded = built.run(
        built.tag,
        "seed_payouts",
        "--accounts",
        "1",
        "--payouts-per-account",
        "2",
        "--balance-minor",
        "10000",
        "--amount-minor",
        "700",
        "--json",
        env={**role_environment("ops", stack_env, base={}), "ROLE": "ops"},
    )
    assert seeded.returncode == 0, seeded.stderr[-3000:]
    executor = built.run(
        built.tag,
        "--until-idle",
        env={
            **role_environment("executor", stack_env, base={}),
            "ROLE": "executor",
            "EXECUTOR_OWNER_ID": "container-executor",
            "METRICS_PORT": str(free_port()),
        },
    )
    assert executor.returncode == 0, executor.stderr[-3000:] + executor.stdout[-3000:]
    payouts = json.loads(seeded.stdout.strip().splitlines()[-1])["payouts"]
    with psycopg.connect(stack_env["PAY_DATABASE_URL"], autocommit=True) as conn:
        states = conn.execute(
            "SELECT state, count(*) FROM payout WHERE payout_id = ANY(%s) GROUP BY 1",
            ([str(p) for p in payouts],),
        ).fetchall()
    assert dict(states) == {"POSTED": 2}


def test_the_built_image_has_no_pip_keeps_its_healthcheck_and_names_its_user(built):
    no_pip = built.run("--entrypoint", "python", built.tag, "-m", "pip", "--version", env={})
    assert no_pip.returncode != 0 and "No module named pip" in no_pip.stderr
    (inspected,) = json.loads(podman("image", "inspect", built.tag).stdout)
    assert inspected["Config"]["User"] == f"{SERVICE_UID}:{SERVICE_UID}"
    healthcheck = inspected.get("Healthcheck") or inspected["Config"].get("Healthcheck") or {}
    assert "scripts/container-healthcheck.py" in healthcheck.get("Test", []), inspected


def test_without_the_base_image_the_skip_names_the_script_that_makes_it(monkeypatch):
    if shutil.which("podman") is None or podman("info", timeout=60).returncode != 0:
        pytest.skip("no podman here: the reason is the engine's, not the base image's")
    monkeypatch.setattr(
        sys.modules[__name__], "base_image", lambda: "localhost/dlock-no-such-base:never"
    )
    reason = skip_reason()
    assert reason and "localhost/dlock-no-such-base:never" in reason and BASE_SCRIPT in reason


def test_ops_migrate_runs_from_the_image_one_database_alias_at_a_time(
    built, stack_env, tls_postgres
):
    """docs/operations.md's ROLE=ops commands: paydb (default), then lockdb, then raildb."""
    fresh = create_live_databases("container_ops", tls_postgres)
    env = {
        "ROLE": "ops",
        "DJANGO_SECRET_KEY": stack_env["DJANGO_SECRET_KEY"],
        "DJANGO_ALLOWED_HOSTS": stack_env["DJANGO_ALLOWED_HOSTS"],
        **fresh,
    }
    for alias in ("default", "lockdb", "raildb"):
        result = built.run(built.tag, "migrate", "--no-input", "--database", alias, env=env)
        assert result.returncode == 0, (alias, result.stderr[-3000:])
    for var, url in fresh.items():
        with psycopg.connect(url, autocommit=True) as conn:
            applied = conn.execute("SELECT count(*) FROM django_migrations").fetchone()
        assert applied and applied[0] > 0, var
