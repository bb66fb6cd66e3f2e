"""The container image and the Kubernetes base keep their invariants (no Docker engine or cluster
is needed: the Dockerfile is read, and the kustomization is parsed, or rendered when kubectl is
installed)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml
from django.urls import Resolver404, resolve

from devstack.common import PROJECT
from dlock import lifecycle
from dlock.budgets import BUDGETS, RAIL_READ_TIMEOUT_S
from dlock.roles import ROLES

K8S = PROJECT / "k8s"
SERVER_ROLES = {  # Deployment name -> ROLE
    "lock-server": "lockserver",
    "payment-resource": "payments",
    "rail-proxy": "railproxy",
    "rail-stub": "railstub",
    "admin": "admin",
}
WORKLOAD_KINDS = {"Deployment", "StatefulSet", "CronJob", "Job"}
COMPONENT = "app.kubernetes.io/component"
# Caller's read budget per role (C3 §3.8), the strictest of the hops that reach it.
CALLER_READ_S = {
    "lockserver": BUDGETS["lock.heartbeat"].read_s,
    "payments": BUDGETS["payments.write"].read_s,
    "railproxy": BUDGETS["rail.submit"].read_s,
    "railstub": BUDGETS["rail.forward"].read_s,
    # a person's browser, which waits far longer: the payments write budget bounds it anyway
    "admin": BUDGETS["payments.write"].read_s,
}


def _documents() -> list[dict]:
    if shutil.which("kubectl"):
        rendered = subprocess.run(
            ["kubectl", "kustomize", str(K8S)], capture_output=True, text=True, check=True
        ).stdout
        return [d for d in yaml.safe_load_all(rendered) if d]
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    docs: list[dict] = []
    for name in kustomization["resources"]:
        if (K8S / name).is_dir():  # a kustomization of its own (deploy/nginx: a generator)
            inner = K8S / name
            docs += _generated_configmaps(
                yaml.safe_load((inner / "kustomization.yaml").read_text()), inner
            )
            continue
        docs += [d for d in yaml.safe_load_all((K8S / name).read_text()) if d]
    return docs + _generated_configmaps(kustomization)


def _generated_configmaps(kustomization: dict, root: Path = K8S) -> list[dict]:
    """What kustomize's configMapGenerator makes, without kustomize: `files` entries
    (`key=path` or `path`) as data, the generator's labels, its name when unhashed."""
    maps = []
    for generator in kustomization.get("configMapGenerator", []):
        options = generator.get("options", {})
        assert options.get("disableNameSuffixHash"), "a hashed name: read it with kubectl"
        data = {}
        for entry in generator.get("files", []):
            key, _, path = entry.rpartition("=")
            data[key or Path(path).name] = (root / path).read_text()
        metadata = {"name": generator["name"], "labels": options.get("labels", {})}
        maps.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": data})
    return maps


DOCS = _documents()


def of_kind(kind: str) -> list[dict]:
    return [d for d in DOCS if d["kind"] == kind]


def named(kind: str, name: str) -> dict:
    return next(d for d in of_kind(kind) if d["metadata"]["name"] == name)


def pod_template(workload: dict) -> dict:
    if workload["kind"] == "CronJob":
        return workload["spec"]["jobTemplate"]["spec"]["template"]
    return workload["spec"]["template"]


def env_of(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container.get("env", [])}


def selects(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


WORKLOADS = [d for d in DOCS if d["kind"] in WORKLOAD_KINDS]


def test_the_base_has_a_deployment_service_and_pdb_per_server_role_and_the_rest():
    for name in SERVER_ROLES:
        named("Deployment", name), named("Service", name), named("PodDisruptionBudget", name)
    named("Deployment", "executor")
    reconciler = named("CronJob", "reconciler")
    container = pod_template(reconciler)["spec"]["containers"][0]
    assert container["args"][0] == "reconcile" and env_of(container)["ROLE"]["value"] == "ops"
    etcd = named("StatefulSet", "etcd")
    assert etcd["spec"]["replicas"] == 3
    assert named("PodDisruptionBudget", "etcd")["spec"]["minAvailable"] == 2
    assert {d["kind"] for d in DOCS} >= {"ConfigMap", "Secret", "NetworkPolicy", "Namespace"}


@pytest.mark.parametrize("name", sorted(SERVER_ROLES))
def test_probe_paths_exist_in_the_roles_urlconf_and_ports_are_named(name):
    """The pod's ports and probes are the proxy sidecar's; gunicorn listens on loopback only."""
    deployment = named("Deployment", name)
    role_container, proxy = pod_template(deployment)["spec"]["containers"]
    role = env_of(role_container)["ROLE"]["value"]
    assert role == SERVER_ROLES[name]
    assert "ports" not in role_container and "readinessProbe" not in role_container
    assert env_of(role_container)["GUNICORN_BIND"]["value"] == "127.0.0.1:8081"
    assert "PORT" not in env_of(role_container) and "METRICS_PORT" not in env_of(role_container)
    assert proxy["name"] == "proxy" and proxy["image"].rsplit("/", 1)[-1].startswith("nginx")
    # the sidecar holds no secret: its env is its config's literal values (EDGE_*, NGINX_*)
    assert "envFrom" not in proxy
    assert all(set(e) == {"name", "value"} for e in proxy["env"])
    assert {p["name"]: p["containerPort"] for p in proxy["ports"]} == {
        "http": 8080,
        "http-metrics": 9100,
    }
    probes = {"readinessProbe": "/health/ready", "livenessProbe": "/health/live"}
    for probe, expected in probes.items():
        get = proxy[probe]["httpGet"]
        assert get["path"] == expected and get["port"] == "http"
        try:
            resolve(get["path"], urlconf=f"{role}.urls")
        except Resolver404:
            pytest.fail(f"{name}: {probe} path {get['path']} is not in {role}.urls")
    annotations = pod_template(deployment)["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == "9100"
    resolve(annotations["prometheus.io/path"], urlconf=f"{role}.urls")
    service = named("Service", name)
    assert {p["name"]: p["targetPort"] for p in service["spec"]["ports"]} == {
        "http": "http",
        "http-metrics": "http-metrics",
    }
    assert selects(
        {"matchLabels": service["spec"]["selector"]}, pod_template(deployment)["metadata"]["labels"]
    )


def proxy_container(name: str) -> dict:
    (proxy,) = [
        c
        for c in pod_template(named("Deployment", name))["spec"]["containers"]
        if c["name"] == "proxy"
    ]
    return proxy


def proxy_files(name: str) -> dict[str, str]:
    """What the nginx image's entrypoint makes of the dlock-nginx ConfigMap in `name`'s proxy
    container: each template filled by envsubst (gettext's, as in the image) with the
    container's environment, restricted to NGINX_ENVSUBST_FILTER's names; by file name."""
    env = {e["name"]: e["value"] for e in proxy_container(name)["env"]}
    names = " ".join(f"${{{n}}}" for n in env if re.search(env["NGINX_ENVSUBST_FILTER"], n))
    files = {}
    for key, text in named("ConfigMap", "dlock-nginx")["data"].items():
        filled = subprocess.run(
            ["envsubst", names], input=text, env=env, capture_output=True, text=True, check=True
        )
        files[key.removesuffix(".template")] = filled.stdout
    return files


def proxy_config(name: str) -> str:
    """The files `name`'s nginx reads (its own role-*.conf, none of another role's), joined."""
    own = f"role-{SERVER_ROLES[name]}"
    return "\n".join(
        text
        for key, text in sorted(proxy_files(name).items())
        if not key.startswith("role-") or key.removesuffix(".conf").split("-http")[0] == own
    )


def test_the_proxy_sidecars_fill_deploy_nginx_with_the_values_make_up_computes(tmp_path):
    """One nginx configuration: the dlock-nginx ConfigMap is deploy/nginx/*.conf.template as
    they are; each server pod mounts it where the official image's envsubst fills it, with
    EDGE_* values equal to what `make up` computes from the same settings
    (devstack.proxy.kubernetes_values); the filled files leave no placeholder the role reads,
    and nginx accepts them."""
    from devstack import proxy
    from devstack.tls import ensure_tls

    templates = {path.name: path.read_text() for path in proxy.DIRECTORY.glob("*.template")}
    configmap = named("ConfigMap", "dlock-nginx")
    assert configmap["data"] == templates
    assert configmap["metadata"]["labels"][COMPONENT] == "proxy"
    for name in SERVER_ROLES:
        container = proxy_container(name)
        volumes = {v["name"]: v for v in pod_template(named("Deployment", name))["spec"]["volumes"]}
        assert volumes["nginx-templates"]["configMap"]["name"] == "dlock-nginx"
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        assert mounts["nginx-templates"] == "/etc/nginx/templates"
        assert mounts["nginx-tmp"] == "/tmp/nginx"  # NGINX_ENVSUBST_OUTPUT_DIR: writable
        assert "command" not in container  # the image's entrypoint runs the envsubst step
        assert container["args"][:5] == ["nginx", "-p", "/tmp/nginx", "-c", "/tmp/nginx/nginx.conf"]
        env = {e["name"]: e["value"] for e in container["env"]}
        edge = {k: v for k, v in env.items() if k.startswith("EDGE_")}
        assert edge == proxy.kubernetes_values(name), name
        assert env["NGINX_ENVSUBST_OUTPUT_DIR"] == "/tmp/nginx"
        assert env["NGINX_ENVSUBST_FILTER"] == "^EDGE_"
        config = proxy_config(name)
        assert "${EDGE_" not in config and "$EDGE_" not in config, name
        assert "upstream dlock_role" in config and "server 127.0.0.1:8081" in config
        assert "proxy_next_upstream off;" in config
        if shutil.which("nginx") or Path("/usr/sbin/nginx").exists():
            prefix = tmp_path / name
            prefix.mkdir()
            files = ensure_tls(tmp_path / "tls")  # the dlock-tls Secret's shape
            # the official image has the stream module built in; Debian's nginx loads it
            module = proxy.stream_module_path()
            load_stream = ["-g", f"load_module {module};"] if module else []
            for key, text in proxy_files(name).items():
                text = text.replace("listen 8080", "listen 127.0.0.1:1")
                text = text.replace("listen 9100", "listen 127.0.0.1:2")
                text = text.replace("/etc/dlock-tls/tls.crt", str(files.certificate))
                text = text.replace("/etc/dlock-tls/tls.key", str(files.key))
                (prefix / key).write_text(text)
            checked = subprocess.run(
                [
                    "/usr/sbin/nginx",
                    "-t",
                    *load_stream,
                    "-p",
                    str(prefix),
                    "-c",
                    str(prefix / "nginx.conf"),
                    "-e",
                    str(prefix / "error.log"),
                ],
                capture_output=True,
                text=True,
            )
            assert checked.returncode == 0, checked.stderr


@pytest.mark.parametrize(
    "workload", WORKLOADS, ids=lambda w: f"{w['kind']}/{w['metadata']['name']}"
)
def test_every_container_runs_as_non_root_without_privileges_and_with_resources(workload):
    spec = pod_template(workload)["spec"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] != 0
    assert spec.get("automountServiceAccountToken") is False
    for container in spec["containers"]:
        ctx = container["securityContext"]
        assert ctx["runAsNonRoot"] is True and ctx.get("runAsUser", 1) != 0
        assert ctx["allowPrivilegeEscalation"] is False
        assert ctx["capabilities"]["drop"] == ["ALL"]
        assert ctx["readOnlyRootFilesystem"] is True
        assert {"cpu", "memory"} <= set(container["resources"]["requests"])
        assert {"cpu", "memory"} <= set(container["resources"]["limits"])
        # Secrets only by name, never a whole Secret into the environment.
        assert all("secretRef" not in source for source in container.get("envFrom", []))


@pytest.mark.parametrize(
    "workload", WORKLOADS, ids=lambda w: f"{w['kind']}/{w['metadata']['name']}"
)
def test_every_workload_has_its_own_network_policy(workload):
    labels = pod_template(workload)["metadata"]["labels"]
    own = [
        p
        for p in of_kind("NetworkPolicy")
        if p["spec"]["podSelector"].get("matchLabels", {}).get(COMPONENT) == labels[COMPONENT]
    ]
    assert len(own) == 1, labels
    assert set(own[0]["spec"]["policyTypes"]) == {"Ingress", "Egress"}
    deny = named("NetworkPolicy", "default-deny")["spec"]
    assert deny["podSelector"] == {} and set(deny["policyTypes"]) == {"Ingress", "Egress"}


def _ingress_sources(name: str) -> set[str]:
    policy = named("NetworkPolicy", name)["spec"]
    return {
        peer["podSelector"]["matchLabels"][COMPONENT]
        for rule in policy.get("ingress", [])
        for peer in rule.get("from", [])
    }


def _egress_targets(name: str) -> set[str]:
    policy = named("NetworkPolicy", name)["spec"]
    targets = {
        peer["podSelector"]["matchLabels"].get(COMPONENT)
        for rule in policy.get("egress", [])
        for peer in rule.get("to", [])
        if "podSelector" in peer
    }
    return targets - {None}


def test_only_the_executor_reaches_the_services_and_only_the_proxy_reaches_the_rail():
    assert _ingress_sources("rail-stub") == {"rail-proxy"}
    assert _ingress_sources("rail-proxy") == {"executor"}
    # Operator Jobs (revoke_lock) are the one deliberate exception; see docs/security.md.
    assert _ingress_sources("lock-server") == {"executor", "operator"}
    assert _ingress_sources("payment-resource") == {"executor", "operator"}
    # the fence-repair Job reads the issued bound (repair_fence; k8s/operator/repair-fence/)
    assert _ingress_sources("etcd") == {"lock-server", "etcd", "fence-repair"}
    # the admin: no pod calls it (staff use kubectl port-forward, which no policy governs)
    assert named("NetworkPolicy", "admin")["spec"]["ingress"] == []
    assert _egress_targets("admin") == set()
    assert _egress_targets("executor") == {"lock-server", "payment-resource", "rail-proxy"}
    callers_of_the_rail = {
        p["metadata"]["name"]
        for p in of_kind("NetworkPolicy")
        if "rail-stub" in _egress_targets(p["metadata"]["name"])
    }
    assert callers_of_the_rail == {"rail-proxy"}


def test_each_role_reaches_only_its_own_database_and_gets_only_its_own_url():
    db_cidr = {}
    for policy in of_kind("NetworkPolicy"):
        for rule in policy["spec"].get("egress", []):
            for peer in rule.get("to", []):
                if "ipBlock" in peer:
                    db_cidr.setdefault(policy["metadata"]["name"], set()).add(
                        peer["ipBlock"]["cidr"]
                    )
    assert len(db_cidr["lock-server"]) == len(db_cidr["rail-stub"]) == 1
    assert db_cidr["payment-resource"] == db_cidr["rail-proxy"] == db_cidr["admin"]
    assert db_cidr["lock-server"].isdisjoint(db_cidr["payment-resource"] | db_cidr["rail-stub"])
    assert "executor" not in db_cidr
    url_keys = {"LOCK_DATABASE_URL", "PAY_DATABASE_URL", "RAIL_DATABASE_URL"}
    expected = {
        "lock-server": {"LOCK_DATABASE_URL"},
        "payment-resource": {"PAY_DATABASE_URL"},
        "rail-proxy": {"PAY_DATABASE_URL"},
        "rail-stub": {"RAIL_DATABASE_URL"},
        "admin": {"PAY_DATABASE_URL"},
        "executor": set(),
    }
    for name, keys in expected.items():
        container = pod_template(named("Deployment", name))["spec"]["containers"][0]
        assert set(env_of(container)) & url_keys == keys, name


@pytest.mark.parametrize("name", sorted(SERVER_ROLES))
def test_the_start_up_line_names_the_address_the_pod_is_reached_at(name):
    """`kubectl logs` shows where the role listens (gunicorn on loopback) and where it is
    reached (the pod IP and the proxy's port), so DLOCK_PUBLIC_ADDRESS is the pod's, not null."""
    spec = pod_template(named("Deployment", name))["spec"]
    env = env_of(spec["containers"][0])
    assert env["POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    proxy = next(c for c in spec["containers"] if c["name"] == "proxy")
    http = next(p["containerPort"] for p in proxy["ports"] if p["name"] == "http")
    assert env["DLOCK_PUBLIC_ADDRESS"]["value"] == f"$(POD_IP):{http}"
    names = [e["name"] for e in spec["containers"][0]["env"]]
    assert names.index("POD_IP") < names.index("DLOCK_PUBLIC_ADDRESS")  # $(...) sees only earlier


@pytest.mark.parametrize("name", sorted(SERVER_ROLES))
def test_drain_and_database_deadlines_fit_inside_the_callers_budget(name):
    deployment = named("Deployment", name)
    spec = pod_template(deployment)["spec"]
    container = spec["containers"][0]
    env = env_of(container)
    role = SERVER_ROLES[name]
    graceful = int(env["GUNICORN_GRACEFUL_TIMEOUT"]["value"])
    pre_stop = int(container["lifecycle"]["preStop"]["exec"]["command"][1])
    assert spec["terminationGracePeriodSeconds"] > graceful + pre_stop
    thread_queue_ms = int(env["SERVER_QUEUE_DEADLINE_MS"]["value"])
    queue_ms = int(env["DB_QUEUE_DEADLINE_MS"]["value"])
    statement_ms = int(env["DB_STATEMENT_TIMEOUT_MS"]["value"])
    own_s = (queue_ms + statement_ms) / 1000
    if role == "railproxy":  # the forward plus the exchanges before and after it
        own_s = BUDGETS["rail.forward"].connect_s + RAIL_READ_TIMEOUT_S + 2 * own_s
    own_s += thread_queue_ms / 1000  # waiting for a worker thread comes first
    assert own_s < CALLER_READ_S[role], (name, own_s)
    if role == "railproxy":
        assert graceful >= own_s
    if role == "lockserver":
        assert graceful > 30  # waitMillis may be 30 s (C3 L4)


def test_the_gunicorn_defaults_drain_the_longest_request_of_each_role(monkeypatch):
    import runpy

    for role in SERVER_ROLES.values():
        monkeypatch.setenv("ROLE", role)
        monkeypatch.delenv("GUNICORN_GRACEFUL_TIMEOUT", raising=False)
        config = runpy.run_path(str(PROJECT / "settings" / "gunicorn.py"))
        assert config["worker_class"] == "dlock.serving.DrainingThreadWorker"
        # Above what the proxy passes on (4 KiB lines, a 16 KiB head), never above gunicorn's caps.
        assert config["limit_request_line"] <= 8190 and config["limit_request_fields"] <= 4096
        assert config["limit_request_field_size"] <= 8190
        assert config["timeout"] > config["graceful_timeout"]
        if role == "railproxy":
            assert config["graceful_timeout"] > 1 + RAIL_READ_TIMEOUT_S
        if role == "lockserver":
            assert config["graceful_timeout"] > 30


# --------------------------------------------------------------------------- Dockerfile


def _stages() -> list[list[str]]:
    lines, current = [], ""
    for raw in (PROJECT / "Dockerfile").read_text().splitlines():
        if raw.strip().startswith("#") and not current:
            continue
        current += raw.rstrip("\\").strip() + " "
        if not raw.rstrip().endswith("\\"):
            if current.strip():
                lines.append(current.strip())
            current = ""
    stages: list[list[str]] = []
    for line in lines:
        if line.upper().startswith("FROM "):
            stages.append([])
        stages[-1].append(line)
    return stages


def test_the_dockerfile_is_multi_stage_slim_non_root_with_a_healthcheck_and_no_build_tools():
    stages = _stages()
    assert len(stages) >= 2
    final = stages[-1]
    assert re.match(r"FROM python:3\.11-slim", final[0])
    user = [line for line in final if line.startswith("USER ")]
    assert user and user[-1].split()[1].split(":")[0] not in ("0", "root")
    assert any(line.startswith("HEALTHCHECK ") for line in final)
    entrypoint = next(line for line in final if line.startswith("ENTRYPOINT "))
    assert "container-entrypoint.sh" in entrypoint
    text = " ".join(final)
    for tool in ("gcc", "build-essential", "apt-get install", "libpq-dev", "pip install"):
        assert tool not in text
    assert "COPY --from=build /opt/venv /opt/venv" in text
    assert "DLOCK_ENVIRONMENT=production" in text


def test_the_image_and_a_checkout_report_pyprojects_version(monkeypatch):
    with (PROJECT / "pyproject.toml").open("rb") as fh:
        release = tomllib.load(fh)["project"]["version"]
    make = subprocess.run(
        ["make", "-n", "image"], cwd=PROJECT, capture_output=True, text=True, check=True
    )
    assert f"--build-arg DLOCK_VERSION={release} " in make.stdout
    final = " ".join(_stages()[-1])
    assert "ARG DLOCK_VERSION" in final and "DLOCK_VERSION=$DLOCK_VERSION" in final
    monkeypatch.delenv("DLOCK_VERSION", raising=False)
    assert lifecycle.version() == release
    monkeypatch.setenv("DLOCK_VERSION", "2.0.0-rc1")
    assert lifecycle.version() == "2.0.0-rc1"


def _pins(lock: str) -> dict[str, str]:
    """name -> version of every `name==version` line of a pip-compile lock."""
    pins = {}
    for line in (PROJECT / lock).read_text().splitlines():
        if m := re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^ \\]+)", line):
            pins[re.sub(r"[-_.]+", "-", m[1]).lower()] = m[2]
    return pins


def _requirements(name: str) -> dict[str, str]:
    pins = {}
    for line in (PROJECT / name).read_text().splitlines():
        if m := re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^]]*\])?==([^ #]+)", line):
            pins[re.sub(r"[-_.]+", "-", m[1]).lower()] = m[3]
    return pins


def test_the_image_installs_the_hash_locked_runtime_dependencies_only():
    build = " ".join(_stages()[0])
    assert "COPY requirements.lock" in build
    assert re.search(r"pip install [^&]*--require-hashes --no-deps -r requirements\.lock", build)
    assert "requirements.txt" not in build and "requirements-dev" not in build
    runtime = _pins("requirements.lock")
    assert {"gunicorn", "django", "psycopg", "orjson", "whitenoise"} <= set(runtime)
    assert {"django-csp", "django-axes", "django-prometheus"} <= set(runtime)
    for tool in ("pytest", "ruff", "schemathesis", "hypothesis", "testcontainers", "pip-tools"):
        assert tool not in runtime
    assert "etcd3gw" not in runtime


def test_every_lock_line_is_pinned_with_hashes_and_agrees_with_its_requirements():
    for source, lock in (
        ("requirements.txt", "requirements.lock"),
        ("requirements-dev.txt", "requirements-dev.lock"),
    ):
        text = (PROJECT / lock).read_text()
        entries = re.split(r"\n(?=[A-Za-z0-9])", text.split("\n", 1)[1])
        for entry in entries:
            if entry.startswith("#") or not entry.strip():
                continue
            assert "==" in entry.splitlines()[0] and "--hash=sha256:" in entry, entry
        pins = _pins(lock)
        for name, version in _requirements(source).items():
            assert pins.get(name) == version, (lock, name)
    runtime, dev = _pins("requirements.lock"), _pins("requirements-dev.lock")
    # the dev environment tests what the image ships: every shared package at the same version
    assert {n: dev.get(n) for n in runtime} == runtime
    assert {"pytest-randomly", "pip-tools"} <= set(dev)
    # no index or wheel directory of the machine that compiled it: the hashes are PyPI's files
    for lock in ("requirements.lock", "requirements-dev.lock"):
        for line in (PROJECT / lock).read_text().splitlines():
            assert not line.startswith(("--index-url", "--extra-index-url", "--find-links")), line


def test_the_dockerignore_allows_every_app_and_nothing_private():
    rules = [
        line.strip()
        for line in (PROJECT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert rules[0] == "*"
    allowed = {r[1:].rstrip("/") for r in rules if r.startswith("!")}
    from settings import ops as every_server_app  # the tooling overlay adds `experiment`

    local_apps = {
        app.split(".")[0]
        for app in every_server_app.INSTALLED_APPS
        if (PROJECT / app.split(".")[0] / "apps.py").exists()
    }
    assert local_apps <= allowed
    assert {"dlock", "settings", "manage.py"} <= allowed
    assert not allowed & {"tests", ".venv", ".run", ".git", "bench", "experiment", "devstack"}


def test_the_entrypoint_knows_every_role_and_refuses_the_rest():
    script = PROJECT / "scripts" / "container-entrypoint.sh"
    subprocess.run(["sh", "-n", str(script)], check=True)
    text = script.read_text()
    for role in ROLES:
        assert re.search(rf"\b{role}\b", text), role
    result = subprocess.run(
        ["sh", str(script)],
        env={"ROLE": "bogus", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        cwd="/",
    )
    assert result.returncode == 2 and "set ROLE" in result.stderr


def test_the_healthcheck_script_passes_for_roles_without_a_listener():
    script = PROJECT / "scripts" / "container-healthcheck.py"
    import sys

    result = subprocess.run([sys.executable, str(script)], env={"ROLE": "executor"})
    assert result.returncode == 0
    result = subprocess.run([sys.executable, str(script)], env={"ROLE": "railstub", "PORT": "1"})
    assert result.returncode == 1


# ------------------------------------------------- issue 14: image and manifests a platform expects


def test_the_image_is_world_readable_whatever_the_umask_and_compiles_bytecode_at_build():
    final = _stages()[-1]
    copy_app = next(i for i, line in enumerate(final) if line.startswith("COPY") and "/app" in line)
    user = next(i for i, line in enumerate(final) if line.startswith("USER "))
    between = " ".join(final[copy_app + 1 : user])
    assert re.search(r"chmod -R a\+rX\S* /app /opt/venv", between)
    assert re.search(r"python -m compileall .*/app .*/opt/venv", between)
    # chmod after compileall, so the __pycache__ directories are readable too.
    assert between.index("compileall") < between.index("chmod")


def test_gunicorns_control_socket_is_off_on_every_role(monkeypatch):
    import runpy

    for role in SERVER_ROLES.values():
        monkeypatch.setenv("ROLE", role)
        config = runpy.run_path(str(PROJECT / "settings" / "gunicorn.py"))
        assert config["control_socket_disable"] is True


def test_the_executor_has_probes_on_its_metrics_server():
    container = pod_template(named("Deployment", "executor"))["spec"]["containers"][0]
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/metrics", "port": "http-metrics"}
    assert "http-metrics" in {p["name"] for p in container["ports"]}
    entrypoint = (PROJECT / "scripts" / "container-entrypoint.sh").read_text()
    assert '--metrics-port "${METRICS_PORT:-9100}"' in entrypoint


@pytest.mark.parametrize(
    "workload",
    [w for w in WORKLOADS if w["spec"].get("replicas", 1) > 1],
    ids=lambda w: f"{w['kind']}/{w['metadata']['name']}",
)
def test_every_multi_replica_workload_spreads_over_nodes_and_zones(workload):
    template = pod_template(workload)
    constraints = template["spec"]["topologySpreadConstraints"]
    assert {c["topologyKey"] for c in constraints} == {
        "kubernetes.io/hostname",
        "topology.kubernetes.io/zone",
    }
    for constraint in constraints:
        assert constraint["maxSkew"] == 1
        assert selects(constraint["labelSelector"], template["metadata"]["labels"])


def migrate_job() -> dict:
    (job,) = [d for d in of_kind("Job") if d["metadata"]["labels"].get(COMPONENT) == "migrate"]
    return job


def test_the_migrate_job_cleans_up_after_itself_and_cannot_hang_a_rollout():
    spec = migrate_job()["spec"]
    assert 0 < spec["activeDeadlineSeconds"] <= 3600
    assert spec["ttlSecondsAfterFinished"] > 0
    docs = (PROJECT / "docs" / "operations.md").read_text()
    assert "kubectl -n dlock wait --for=condition=complete job/migrate-" in docs


def _kustomize(path) -> list[dict]:
    out = subprocess.run(
        ["kubectl", "kustomize", str(path)], capture_output=True, text=True, check=True
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


@pytest.mark.skipif(not shutil.which("kubectl"), reason="kubectl renders the kustomization")
def test_each_release_gets_its_own_migrate_job_named_after_its_image_tag(tmp_path):
    job = migrate_job()
    image = job["spec"]["template"]["spec"]["containers"][0]["image"]
    assert job["metadata"]["name"] == f"migrate-{image.rsplit(':', 1)[1]}"
    # an overlay that sets another tag (and copies the replacements block, as documented)
    base = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    (dlock_image,) = [i for i in base["images"] if i["name"] == "dlock"]
    overlay = tmp_path / "release"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [os.path.relpath(K8S, overlay)],
                "images": [{"name": dlock_image["newName"], "newTag": "0.2.0-rc1"}],
                "replacements": base["replacements"],
            }
        )
    )
    jobs = [d for d in _kustomize(overlay) if d["kind"] == "Job"]
    assert [j["metadata"]["name"] for j in jobs] == ["migrate-0.2.0-rc1"]
    assert jobs[0]["spec"]["template"]["spec"]["containers"][0]["image"].endswith(":0.2.0-rc1")


def test_allowed_hosts_are_the_service_names_never_a_wildcard():
    config = named("ConfigMap", "dlock-settings")["data"]
    hosts = config["DJANGO_ALLOWED_HOSTS"].split(",")
    assert "*" not in hosts and all(h and not h.startswith(".") for h in hosts)
    services = {d["metadata"]["name"] for d in of_kind("Service")} & set(SERVER_ROLES)
    assert services == set(SERVER_ROLES)
    for service in services:
        assert service in hosts and f"{service}.dlock.svc.cluster.local" in hosts
        assert f"{service}.dlock.svc" in hosts
    for url_var in ("LOCK_SERVER_URL", "PAYMENTS_URL", "RAIL_PROXY_URL", "RAIL_STUB_URL"):
        assert config[url_var].split("//")[1].split(":")[0] in hosts  # what callers send
    for workload in WORKLOADS:  # no workload widens it
        for container in pod_template(workload)["spec"]["containers"]:
            assert "DJANGO_ALLOWED_HOSTS" not in env_of(container)


def test_the_reconciler_gets_no_lock_database():
    container = pod_template(named("CronJob", "reconciler"))["spec"]["containers"][0]
    env = env_of(container)
    assert "LOCK_DATABASE_URL" not in env
    assert {"PAY_DATABASE_URL", "RAIL_DATABASE_URL"} <= set(env)


OPERATOR_JOB = PROJECT / "k8s" / "operator" / "job.yaml"
ALLOWED_RESTRICTED_VOLUMES = {
    "configMap",
    "emptyDir",
    "projected",
    "secret",
    "downwardAPI",
    "persistentVolumeClaim",
    "ephemeral",
    "csi",
}


def restricted_violations(pod_spec: dict) -> list[str]:
    """The Pod Security Standard "restricted" (v1.25+) checks that apply to our pods."""
    found = []
    pod_ctx = pod_spec.get("securityContext", {})
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if pod_spec.get(key):
            found.append(key)
    for volume in pod_spec.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= ALLOWED_RESTRICTED_VOLUMES:
            found.append(f"volume {volume['name']}: {kinds}")
    for container in pod_spec.get("initContainers", []) + pod_spec["containers"]:
        ctx = container.get("securityContext", {})
        name = container["name"]
        if ctx.get("runAsNonRoot", pod_ctx.get("runAsNonRoot")) is not True:
            found.append(f"{name}: runAsNonRoot")
        if ctx.get("runAsUser", pod_ctx.get("runAsUser")) == 0:
            found.append(f"{name}: runAsUser 0")
        if ctx.get("allowPrivilegeEscalation") is not False:
            found.append(f"{name}: allowPrivilegeEscalation")
        if ctx.get("privileged"):
            found.append(f"{name}: privileged")
        caps = ctx.get("capabilities", {})
        if caps.get("drop") != ["ALL"] or set(caps.get("add", [])) - {"NET_BIND_SERVICE"}:
            found.append(f"{name}: capabilities")
        seccomp = ctx.get("seccompProfile", pod_ctx.get("seccompProfile", {})).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            found.append(f"{name}: seccompProfile")
        if any(p.get("hostPort") for p in container.get("ports", [])):
            found.append(f"{name}: hostPort")
    return found


def test_every_pod_and_the_operator_job_pass_restricted_pod_security():
    assert (
        named("Namespace", "dlock")["metadata"]["labels"]["pod-security.kubernetes.io/enforce"]
        == "restricted"
    )
    (job,) = [d for d in yaml.safe_load_all(OPERATOR_JOB.read_text()) if d]
    for workload in [*WORKLOADS, job]:
        assert restricted_violations(pod_template(workload)["spec"]) == [], workload["metadata"]
    # What its commands need (settings/ops.py): the secret key, paydb and raildb; no lockdb
    # (repair_fence, which reads the lock server's store, has its own Job).
    container = pod_template(job)["spec"]["containers"][0]
    env = env_of(container)
    assert env["ROLE"]["value"] == "ops"
    for var in ("DJANGO_SECRET_KEY", "PAY_DATABASE_URL", "RAIL_DATABASE_URL"):
        assert env[var]["valueFrom"]["secretKeyRef"]["name"] == "dlock-secrets", var
    assert "LOCK_DATABASE_URL" not in env
    assert container["envFrom"] == [{"configMapRef": {"name": "dlock-settings"}}]
    # The operator label is the one the NetworkPolicies let reach lock-server and paydb.
    assert pod_template(job)["metadata"]["labels"]["app.kubernetes.io/component"] == "operator"
    assert job["spec"]["backoffLimit"] == 0


def test_the_operator_job_carries_its_credential_and_reaches_every_store_its_commands_read():
    """Issue 26: revoke_lock needs the operator bearer (else UNAUTHENTICATED, revoked:false);
    reconcile, rail_statement and the books commands read raildb."""
    (job,) = [d for d in yaml.safe_load_all(OPERATOR_JOB.read_text()) if d]
    env = env_of(pod_template(job)["spec"]["containers"][0])
    assert env["DLOCK_OPERATOR_CREDENTIAL"]["valueFrom"]["secretKeyRef"] == {
        "name": "dlock-secrets",
        "key": "DLOCK_OPERATOR_CREDENTIAL",
    }
    secret = named("Secret", "dlock-secrets")
    assert "DLOCK_OPERATOR_CREDENTIAL" in {**secret.get("stringData", {}), **secret.get("data", {})}
    policy = named("NetworkPolicy", "operator")["spec"]
    assert selects(policy["podSelector"], pod_template(job)["metadata"]["labels"])
    database_peers = {
        peer["ipBlock"]["cidr"]
        for rule in policy["egress"]
        if {"port": 5432, "protocol": "TCP"} in rule.get("ports", [])
        for peer in rule["to"]
    }
    reconciler = named("NetworkPolicy", "reconciler")["spec"]
    reconciler_peers = {
        peer["ipBlock"]["cidr"] for rule in reconciler["egress"] for peer in rule["to"]
    }
    assert reconciler_peers <= database_peers  # paydb and raildb, as the reconciler has


def test_restricted_pod_security_check_catches_a_root_pod():
    bad = {"containers": [{"name": "x", "securityContext": {"runAsUser": 0}}]}
    assert {"x: runAsNonRoot", "x: runAsUser 0", "x: capabilities"} <= set(
        restricted_violations(bad)
    )


# The oldest Kubernetes the manifests are documented for (docs/operations.md) and the newest.
K8S_VERSIONS = ("1.25.0", "1.37.0")
BUILTIN_FILES = [
    *sorted((PROJECT / "k8s").glob("*.yaml")),
    *sorted((PROJECT / "k8s" / "operator").rglob("*.yaml")),
]


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_manifest_validates_strictly_against_the_kubernetes_schemas(version):
    import kubernetes_validate

    checked = 0
    for path in BUILTIN_FILES:
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                # Strict: an unknown or misspelt field is an error, not silently dropped.
                kubernetes_validate.validate(doc, version, strict=True)
                checked += 1
    assert checked >= 20


def test_strict_validation_rejects_a_misspelt_field():
    import kubernetes_validate

    job = next(d for d in yaml.safe_load_all(OPERATOR_JOB.read_text()) if d)
    job["spec"]["ttlSecondsAfterFinish"] = 60
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, K8S_VERSIONS[0], strict=True)


def test_the_docs_state_the_minimum_kubectl_and_kustomize_versions():
    docs = (PROJECT / "docs" / "operations.md").read_text()
    assert re.search(r"kubectl\s*(>=|≥)\s*1\.25", docs)
    assert re.search(r"kustomize\s*(>=|≥)\s*v?4\.5\.7", docs)


VERIFYING_ROLES = {"payment-resource", "rail-proxy"}


def test_only_the_lock_server_mounts_private_keys_and_the_verifiers_get_public_ones():
    assert "DLOCK_PROOF_KEYS" in named("Secret", "dlock-secrets")["stringData"]
    assert "DLOCK_FENCING_PUBLIC_KEYS" not in named("Secret", "dlock-secrets")["stringData"]
    assert "DLOCK_FENCING_PUBLIC_KEYS" in named("ConfigMap", "dlock-fencing-keys")["data"]
    for workload in WORKLOADS:
        for container in pod_template(workload)["spec"]["containers"]:
            env = env_of(container)
            name = workload["metadata"]["name"]
            if container["name"] == "proxy":  # the nginx sidecar: its config's values only
                assert all(n.startswith(("EDGE_", "NGINX_")) for n in env), name
                assert all(set(e) == {"name", "value"} for e in env.values()), name
                continue
            if name == "lock-server":
                ref = env["DLOCK_PROOF_KEYS"]["valueFrom"]["secretKeyRef"]
                assert ref == {"name": "dlock-secrets", "key": "DLOCK_PROOF_KEYS"}, name
            else:
                assert "DLOCK_PROOF_KEYS" not in env, name
            if name in VERIFYING_ROLES:
                ref = env["DLOCK_FENCING_PUBLIC_KEYS"]["valueFrom"]["configMapKeyRef"]
                assert ref == {"name": "dlock-fencing-keys", "key": "DLOCK_FENCING_PUBLIC_KEYS"}


REPAIR_JOB = PROJECT / "k8s" / "operator" / "repair-fence" / "job.yaml"


def _egress(policy: str) -> tuple[set[str], set[str]]:
    """(ipBlock cidrs, pod components) a NetworkPolicy lets its pods reach."""
    spec = named("NetworkPolicy", policy)["spec"]
    cidrs = {p["ipBlock"]["cidr"] for r in spec["egress"] for p in r["to"] if "ipBlock" in p}
    pods = {
        p["podSelector"]["matchLabels"]["app.kubernetes.io/component"]
        for r in spec["egress"]
        for p in r["to"]
        if "podSelector" in p
    }
    return cidrs, pods


LOCKDB, PAYDB, RAILDB = "10.20.0.10/32", "10.20.0.11/32", "10.20.0.12/32"


def test_repair_fence_runs_from_its_own_job_reaching_the_lock_store_and_paydb_only():
    (job,) = [d for d in yaml.safe_load_all(REPAIR_JOB.read_text()) if d]
    template = pod_template(job)
    assert restricted_violations(template["spec"]) == []
    container = template["spec"]["containers"][0]
    assert container["args"][0] == "repair_fence" and job["spec"]["backoffLimit"] == 0
    env = env_of(container)
    assert env["LOCK_DATABASE_URL"]["valueFrom"]["secretKeyRef"]["key"] == "LOCK_DATABASE_URL"
    assert "DLOCK_OPERATOR_CREDENTIAL" not in env
    labels = template["metadata"]["labels"]
    assert labels["app.kubernetes.io/component"] == "fence-repair"
    assert selects(named("NetworkPolicy", "fence-repair")["spec"]["podSelector"], labels)
    assert _egress("fence-repair") == ({LOCKDB, PAYDB}, {"etcd"})
    etcd_clients = {
        p["podSelector"]["matchLabels"]["app.kubernetes.io/component"]
        for r in named("NetworkPolicy", "etcd")["spec"]["ingress"]
        for p in r["from"]
    }
    assert "fence-repair" in etcd_clients
    # and the general operator Job reaches neither lock store
    cidrs, pods = _egress("operator")
    assert cidrs == {PAYDB, RAILDB} and pods == {"lock-server", "payment-resource"}


@pytest.mark.skipif(not shutil.which("kubectl"), reason="kubectl renders the kustomization")
def test_the_operator_jobs_get_the_release_image_through_kustomize():
    base = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    (dlock_image,) = [i for i in base["images"] if i["name"] == "dlock"]
    expected = f"{dlock_image['newName']}:{dlock_image['newTag']}"
    for path in (OPERATOR_JOB, REPAIR_JOB):
        raw = next(d for d in yaml.safe_load_all(path.read_text()) if d)
        assert pod_template(raw)["spec"]["containers"][0]["image"] == "dlock"  # not hard-coded
        (job,) = _kustomize(path.parent)
        assert job["metadata"]["namespace"] == "dlock"
        assert pod_template(job)["spec"]["containers"][0]["image"] == expected


def test_the_reconciler_cronjob_reports_broken_books_as_a_metric_not_a_failed_job():
    cron = named("CronJob", "reconciler")
    args = pod_template(cron)["spec"]["containers"][0]["args"]
    assert args[0] == "reconcile" and "--exit-zero" in args


# ------------------------------------------------------------------ TLS on every hop (issue 38)


def _settings() -> dict[str, str]:
    return named("ConfigMap", "dlock-settings")["data"]


def test_every_service_url_is_https_verified_against_the_mounted_ca():
    settings = _settings()
    for var in ("LOCK_SERVER_URL", "PAYMENTS_URL", "RAIL_PROXY_URL", "RAIL_STUB_URL", "ETCD_URL"):
        assert all(url.startswith("https://") for url in settings[var].split(",")), var
    assert settings["DLOCK_CA_BUNDLE"] == "/etc/dlock-ca/ca.crt"
    for workload in WORKLOADS:
        spec = pod_template(workload)["spec"]
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for container in spec["containers"]:
            if container["name"] == "proxy" or container["image"].startswith("gcr.io/etcd"):
                continue
            mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}
            assert mounts.get("/etc/dlock-ca") == "ca", (workload["metadata"]["name"], mounts)
            secret = volumes["ca"]["secret"]
            assert secret["secretName"] == "dlock-tls"
            assert secret["items"] == [{"key": "ca.crt", "path": "ca.crt"}]  # never the key


def test_every_database_url_verifies_the_server_certificate():
    secret = named("Secret", "dlock-secrets")["stringData"]
    for var in ("LOCK_DATABASE_URL", "PAY_DATABASE_URL", "RAIL_DATABASE_URL"):
        assert "sslmode=verify-full" in secret[var], var
        assert "sslrootcert=/etc/dlock-db-ca/ca.crt" in secret[var], var
    for workload in WORKLOADS:
        for container in pod_template(workload)["spec"]["containers"]:
            if any(name.endswith("_DATABASE_URL") for name in env_of(container)):
                mounts = {m["mountPath"] for m in container.get("volumeMounts", [])}
                assert "/etc/dlock-db-ca" in mounts, workload["metadata"]["name"]


def test_each_role_serves_https_behind_its_proxy_and_probes_speak_it():
    for name in SERVER_ROLES:
        config = proxy_config(name)
        # each port is capped per address at accept (stream), then TLS on its inner listener
        assert "listen 8080;" in config and "listen 9100;" in config
        assert "listen 127.0.0.1:8082 ssl proxy_protocol" in config
        assert "listen 127.0.0.1:9101 ssl proxy_protocol" in config
        assert "ssl_certificate /etc/dlock-tls/tls.crt;" in config
        assert "CBC" not in config and ":AES128-SHA" not in config
        assert "ssl_ciphers ECDHE-ECDSA-AES128-GCM-SHA256:" in config
        pod = pod_template(named("Deployment", name))
        (proxy,) = [c for c in pod["spec"]["containers"] if c["name"] == "proxy"]
        for probe in ("readinessProbe", "livenessProbe"):
            assert proxy[probe]["httpGet"]["scheme"] == "HTTPS", (name, probe)
        assert pod["metadata"]["annotations"]["prometheus.io/scheme"] == "https"
        tls = {v["name"]: v for v in pod["spec"]["volumes"]}["tls"]["secret"]
        assert tls["secretName"] == "dlock-tls" and not tls.get("optional")


def test_etcd_serves_https_and_verifies_its_clients_and_peers():
    (etcd,) = pod_template(named("StatefulSet", "etcd"))["spec"]["containers"]
    args = etcd["args"]
    for flag in ("--client-cert-auth", "--peer-client-cert-auth"):
        assert flag in args
    assert "--listen-client-urls=https://0.0.0.0:2379" in args
    assert "--listen-peer-urls=https://0.0.0.0:2380" in args
    assert "--trusted-ca-file=/etc/etcd-tls/ca.crt" in args
    assert all("http://" not in a for a in args if a.startswith("--initial-cluster="))
    (lock,) = [
        c
        for c in pod_template(named("Deployment", "lock-server"))["spec"]["containers"]
        if c["name"] == "lock-server"
    ]
    env = {e["name"]: e.get("value") for e in lock["env"]}
    assert env["DLOCK_CLIENT_CERT"] == "/etc/dlock-etcd-client/tls.crt"
    assert env["DLOCK_CLIENT_KEY"] == "/etc/dlock-etcd-client/tls.key"


def test_the_proxy_image_is_a_supported_nginx_pinned_by_tag_and_digest():
    base = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    (nginx,) = [i for i in base["images"] if i["name"] == "nginx"]
    major, minor, _patch = (int(part) for part in nginx["newTag"].split("."))
    assert (major, minor) >= (1, 28) and minor % 2 == 0  # a stable branch, 1.22 is long gone
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", nginx["digest"])


def test_only_the_admins_proxy_limits_log_ins_and_the_admin_holds_no_ring_or_hashes():
    """issue 38: the log-in limit lives in the admin's nginx (a 429 envelope), nowhere else; the
    admin pod gets paydb and the secret key, never the proof ring or the credential hashes."""
    for name in SERVER_ROLES:
        config = proxy_config(name)
        if name == "admin":
            assert "location = /admin/login/ {" in config
            assert "limit_req zone=admin_login" in config and "limit_req_status 429;" in config
            assert "error_page 429 = /_dlock/429;" in config
            assert '"code":"OVERLOADED"' in config.split("location = /_dlock/429")[1][:900]
        else:
            assert "limit_req" not in config and "/admin/" not in config, name
    container = pod_template(named("Deployment", "admin"))["spec"]["containers"][0]
    env = env_of(container)
    assert env["ROLE"]["value"] == "admin"
    assert not {"DLOCK_PROOF_KEYS", "DLOCK_CREDENTIALS"} & set(env)
    assert {"DJANGO_SECRET_KEY", "PAY_DATABASE_URL"} <= set(env)
    migrate = pod_template(
        named("Job", "migrate-0.1.0" if shutil.which("kubectl") else "migrate-TAG")
    )
    assert "ROLE=admin python manage.py migrate" in migrate["spec"]["containers"][0]["args"][0]
