"""The image's environment starts every role (issue 24, item 2).

The runtime virtualenv is built by the Dockerfile's own build-stage commands (read from the
Dockerfile, `/opt/venv` replaced by a folder under `.run/image-venv/`, against PyPI alone), from
the hash-locked runtime lock and nothing else; it is cached by the hash of the lock and those
commands. The application is the `.dockerignore` allow-list copied to a fresh folder, so neither
the test tree nor the development tools can be imported. Each server role is started through
`scripts/container-entrypoint.sh` with the final stage's ENV (listening on loopback) and the
environment devstack gives that role, and must answer /health/ready 200; then the executor
pays seeded payouts and two ops commands (the migrate Job's migrations, reconcile) run from it.
The databases are on a cluster that speaks TLS only (tests.conftest.tls_postgres), reached with
`sslmode=verify-full` URLs as in k8s: the image refuses any other, and nothing lifts that.

The image itself, built by podman and run as the pods run it: test_image_container.py."""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
import requests

from devstack.common import PROJECT, URL_ENV, free_port
from devstack.envfile import new_proof_keys, public_keys_of
from devstack.roles import RoleProcess, stop_all
from devstack.secrets_env import role_environment
from tests import credentials
from tests.conftest import create_live_databases

pytestmark = [pytest.mark.live, pytest.mark.slow]

DOCKERFILE = PROJECT / "Dockerfile"
LOCK = PROJECT / "requirements.lock"
CACHE = PROJECT / ".run" / "image-venv"
SERVER_ROLES = ("lockserver", "payments", "railproxy", "railstub", "admin")

PROOF_KEYS = new_proof_keys()


# --------------------------------------------------------------------------- the Dockerfile


def instructions() -> list[list[tuple[str, str]]]:
    """The Dockerfile's stages, each a list of (INSTRUCTION, arguments), continuations joined."""
    stages: list[list[tuple[str, str]]] = []
    joined = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    for line in joined.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        if word == "FROM":
            stages.append([])
        stages[-1].append((word, rest.strip()))
    return stages


def stage_env(stage: list[tuple[str, str]]) -> dict[str, str]:
    env: dict[str, str] = {}
    for word, rest in stage:
        if word == "ENV":
            env |= dict(item.split("=", 1) for item in shlex.split(rest))
    return env


def build_commands() -> list[str]:
    """The build stage's RUN commands, as the image's build runs them."""
    return [rest for word, rest in instructions()[0] if word == "RUN"]


def base_python() -> str:
    return getattr(sys, "_base_executable", None) or sys.executable


def pypi_only_env(extra: dict[str, str]) -> dict[str, str]:
    """The image's build sees no pip configuration of this machine (local wheel folders,
    extra indexes, constraints): only PyPI and the build stage's ENV."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    return {**env, "PIP_CONFIG_FILE": os.devnull, **extra}


def image_venv() -> Path:
    """The runtime virtualenv, built once per (lock, build commands) as the build stage does."""
    commands = build_commands()
    assert commands, "the Dockerfile's build stage has no RUN"
    digest = hashlib.sha256(LOCK.read_bytes() + "\n".join(commands).encode()).hexdigest()[:16]
    venv = CACHE / digest
    if (venv / ".built").exists() and (venv / "bin" / "python").exists():
        return venv
    shutil.rmtree(venv, ignore_errors=True)  # a build that was interrupted
    workdir = CACHE / f"{digest}.src"
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    shutil.copy(LOCK, workdir / "requirements.lock")  # COPY requirements.lock ./
    env = pypi_only_env(stage_env(instructions()[0]))
    env["PATH"] = f"{Path(base_python()).parent}:/usr/bin:/bin"  # the base image's `python`
    for command in commands:
        script = command.replace("/opt/venv", str(venv))
        result = subprocess.run(
            ["/bin/sh", "-ec", script], cwd=workdir, env=env, capture_output=True, text=True
        )
        assert result.returncode == 0, f"{script}\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    shutil.rmtree(workdir)
    (venv / ".built").write_text(LOCK.read_text())
    for old in CACHE.iterdir():  # keep only the environment of the current lock
        if old != venv:
            shutil.rmtree(old, ignore_errors=True)
    return venv


def copy_application(target: Path) -> Path:
    """`COPY . /app` under the `.dockerignore` allow-list: only what the image ships."""
    rules = [
        line.strip()
        for line in (PROJECT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert rules[0] == "*"

    def shipped(rel: str) -> bool:
        keep = False
        for rule in rules:
            negate = rule.startswith("!")
            pattern = rule[1:] if negate else rule
            pattern = pattern.rstrip("/")
            parts = rel.split("/")
            prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
            hit = any(fnmatch.fnmatch(p, pattern) for p in prefixes) or (
                pattern.startswith("**/") and any(fnmatch.fnmatch(x, pattern[3:]) for x in parts)
            )
            if hit:
                keep = negate
        return keep

    for path in sorted(PROJECT.rglob("*")):
        rel = path.relative_to(PROJECT).as_posix()
        if rel.startswith((".git", ".venv", ".run")) or not path.is_file():
            continue
        if shipped(rel):
            (target / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target / rel)
    return target


# --------------------------------------------------------------------------- fixtures


class Image:
    def __init__(self, venv: Path, app: Path, env: dict[str, str], logdir: Path):
        self.venv, self.app, self.env, self.logdir = venv, app, env, logdir

    @property
    def entrypoint(self) -> list[str]:
        return ["/bin/sh", str(self.app / "scripts" / "container-entrypoint.sh")]

    def process_env(self, role: str, extra: dict[str, str] | None = None) -> dict[str, str]:
        """The final stage's ENV (loopback instead of 0.0.0.0), this venv first on PATH, and
        what devstack gives this role; nothing of the test process's own environment."""
        env = stage_env(instructions()[-1])
        env["PATH"] = f"{self.venv}/bin:/usr/bin:/bin"
        env |= {"HOME": str(self.logdir), "BIND_HOST": "127.0.0.1", "ROLE": role}
        return {**env, **role_environment(role, self.env, base={}), **(extra or {})}

    def run(self, role: str, *args: str, extra: dict[str, str] | None = None, timeout=180):
        return subprocess.run(
            [*self.entrypoint, *args],
            cwd="/",
            env=self.process_env(role, extra),
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def python(self, role: str, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["python", *args],
            cwd=self.app,
            env=self.process_env(role),
            capture_output=True,
            text=True,
            timeout=180,
        )


@pytest.fixture(scope="module")
def image(tmp_path_factory, tls_postgres) -> Image:
    venv = image_venv()
    app = copy_application(tmp_path_factory.mktemp("app"))
    logdir = tmp_path_factory.mktemp("image-logs")
    env = {
        "DJANGO_SECRET_KEY": os.urandom(32).hex(),
        "DLOCK_PROOF_KEYS": PROOF_KEYS,  # production refuses the development key
        "DLOCK_FENCING_PUBLIC_KEYS": public_keys_of(PROOF_KEYS),  # the verifiers'
        "LOCK_BACKEND": "pg",
        "DJANGO_ALLOWED_HOSTS": "127.0.0.1,localhost",
        "DLOCK_CREDENTIALS": credentials.CREDENTIALS,
        "DLOCK_EXECUTOR_CREDENTIAL": credentials.EXECUTOR,
        "DLOCK_OPERATOR_CREDENTIAL": credentials.OPERATOR,
        # production takes verify-full URLs only: a cluster that speaks TLS, as k8s's does
        **create_live_databases("image", tls_postgres),
    }
    return Image(venv, app, env, logdir)


@pytest.fixture(scope="module")
def image_roles(image):
    # the migrate Job's commands (k8s/reconciler.yaml), from the image
    for role in ("lockserver", "admin", "railstub"):
        result = image.python(role, "manage.py", "migrate", "--no-input", "-v", "0")
        assert result.returncode == 0, result.stderr[-3000:]
    ports = {role: free_port() for role in SERVER_ROLES}
    image.env |= {URL_ENV[role]: f"http://127.0.0.1:{port}" for role, port in ports.items()}
    procs = {}
    for role, port in ports.items():
        env = image.process_env(role)
        env.pop("PORT", None)
        procs[role] = RoleProcess(
            role,
            port,
            env,
            image.logdir / f"{role}.log",
            server=image.entrypoint,
            inherit_environ=False,
        ).start(wait=False)
    try:
        for proc in procs.values():
            proc.wait_ready(timeout=120)
        yield procs
    finally:
        stop_all(procs.values())


# --------------------------------------------------------------------------- tests


def test_the_image_environment_holds_the_runtime_lock_and_nothing_else(image):
    frozen = subprocess.run(
        [str(image.venv / "bin" / "python"), "-m", "pip", "--version"], capture_output=True
    )
    assert frozen.returncode != 0  # the build stage removes pip, as the image has none
    site = next((image.venv / "lib").glob("python3*/site-packages"))
    installed = {
        re.sub(r"[-_.]+", "-", d.name.split("-")[0]).lower() for d in site.glob("*.dist-info")
    }
    locked = {
        re.sub(r"[-_.]+", "-", m[1]).lower()
        for m in re.finditer(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==", LOCK.read_text(), re.M)
    }
    assert installed == locked - {"pip", "setuptools", "wheel"}
    for tool in ("pytest", "ruff", "schemathesis", "selenium", "hypothesis", "pip-tools"):
        assert tool not in installed
    assert not (image.app / "tests").exists() and not (image.app / "devstack").exists()


def test_every_server_role_starts_from_the_image_environment_to_ready(image, image_roles):
    for role, proc in image_roles.items():
        ready = requests.get(f"{proc.url}/health/ready", timeout=5)
        assert ready.status_code == 200, (role, ready.text)
        assert proc.started_env["PATH"].split(":")[0] == f"{image.venv}/bin"
        assert "PYTHONPATH" not in proc.started_env and proc.started_env["ROLE"] == role
        # the pod (its nginx in front) runs the image's entrypoint, which execs its gunicorn
        exes = [
            Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
            for child in Path(f"/proc/{proc.process.pid}/task/{proc.process.pid}/children")
            .read_text()
            .split()
        ]
        assert any(exe[0].decode().startswith(str(image.venv)) for exe in exes), exes
        assert proc.argv[-1].endswith("container-entrypoint.sh")
    admin = requests.get(f"{image_roles['admin'].url}/admin/login/", timeout=5)
    assert admin.status_code == 200 and "csrfmiddlewaretoken" in admin.text
    css = requests.get(f"{image_roles['admin'].url}/static/admin/css/base.css", timeout=5)
    assert css.status_code == 200  # whitenoise serves the styled admin from the image
    # the admin starts with neither the proof ring nor the credential hashes (as k8s gives it)
    assert not {"DLOCK_PROOF_KEYS", "DLOCK_CREDENTIALS"} & set(image_roles["admin"].started_env)
    # and payment-resource serves no admin page at all
    assert requests.get(f"{image_roles['payments'].url}/admin/", timeout=5).status_code == 404


def test_every_role_reaches_its_database_over_verified_tls(image, image_roles):
    url = image.env["PAY_DATABASE_URL"]
    assert "sslmode=verify-full" in url and "sslrootcert=" in url
    with pytest.raises(psycopg.OperationalError):  # the cluster refuses clear text
        psycopg.connect(url.split("?")[0] + "?sslmode=disable", connect_timeout=5).close()
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT a.application_name, s.ssl FROM pg_stat_activity a JOIN pg_stat_ssl s "
            "USING (pid) WHERE a.application_name = ANY(%s)",
            (list(SERVER_ROLES),),
        ).fetchall()
    assert {name for name, _ in rows} == set(SERVER_ROLES), rows  # each role's pool
    assert all(ssl for _, ssl in rows), rows


def test_the_executor_and_the_ops_commands_run_from_the_image_environment(image, image_roles):
    seeded = image.run(
        "ops",
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
    )
    assert seeded.returncode == 0, seeded.stderr[-3000:]
    metrics_port = free_port()
    executor = image.run(
        "executor",
        "--until-idle",
        extra={"METRICS_PORT": str(metrics_port), "EXECUTOR_OWNER_ID": "image-executor"},
    )
    assert executor.returncode == 0, executor.stderr[-3000:] + executor.stdout[-3000:]
    metrics_file = image.logdir / "reconcile.prom"
    # as the reconciler CronJob runs it: paydb and raildb, no lock database
    report = image.run(
        "ops",
        "reconcile",
        "--json",
        "--metrics-file",
        str(metrics_file),
        extra={"LOCK_DATABASE_URL": ""},
    )
    assert report.returncode == 0, report.stdout[-3000:] + report.stderr[-3000:]
    assert json.loads(report.stdout)["ok"] is True
    assert "reconcile_ok 1" in metrics_file.read_text()

    payouts = json.loads(seeded.stdout.strip().splitlines()[-1])["payouts"]
    with psycopg.connect(image.env["PAY_DATABASE_URL"], autocommit=True) as conn:
        states = conn.execute(
            "SELECT state, count(*) FROM payout WHERE payout_id = ANY(%s) GROUP BY 1",
            ([str(p) for p in payouts],),
        ).fetchall()
    assert dict(states) == {"POSTED": 2}


def _k8s_allowed_hosts() -> str:
    import yaml

    for doc in yaml.safe_load_all((PROJECT / "k8s" / "config.yaml").read_text()):
        if doc and doc["kind"] == "ConfigMap":
            return doc["data"]["DJANGO_ALLOWED_HOSTS"]
    raise AssertionError("no ConfigMap in k8s/config.yaml")


def test_with_the_k8s_allowed_hosts_probes_by_pod_ip_pass_and_foreign_hosts_do_not(image):
    hosts = _k8s_allowed_hosts()
    port = free_port()
    env = image.process_env("railstub", {"DJANGO_ALLOWED_HOSTS": hosts})
    env.pop("PORT", None)
    proc = RoleProcess(
        "railstub",
        port,
        env,
        image.logdir / "railstub-hosts.log",
        server=image.entrypoint,
        inherit_environ=False,
    ).start(wait=False)
    try:
        proc.wait_ready(timeout=120)  # the readiness check itself sends Host: 127.0.0.1:<port>
        url = f"http://127.0.0.1:{port}"
        for path in ("/health/ready", "/health/live", "/metrics"):  # kubelet, Prometheus
            probe = requests.get(f"{url}{path}", headers={"Host": "10.42.7.19:8080"}, timeout=5)
            assert probe.status_code == 200, path
        for host in ("evil.example", "10.42.7.19:8080", "rail-stub.attacker.example"):
            refused = requests.get(f"{url}/v1/schema", headers={"Host": host}, timeout=5)
            assert refused.status_code == 400, host
            assert refused.headers["Content-Type"].startswith("application/json")
        for host in ("rail-stub:8080", "rail-stub.dlock.svc.cluster.local:8080"):
            served = requests.get(f"{url}/v1/schema", headers={"Host": host}, timeout=5)
            assert served.status_code == 200, host
    finally:
        proc.stop()


def test_production_refuses_a_wildcard_allowed_hosts_at_start_up(image):
    result = image.python(
        "railstub",
        "-c",
        "import django; from dlock.roles import configure_settings_module; "
        "configure_settings_module(); django.setup()",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    env = image.process_env("railstub", {"DJANGO_ALLOWED_HOSTS": "*"})
    refused = subprocess.run(
        ["python", "manage.py", "check"],
        cwd=image.app,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode != 0
    assert "DJANGO_ALLOWED_HOSTS='*' is refused in production" in refused.stderr
