"""`make monitor`: Debian's Prometheus against the running local stack, with the shipped scrape
configuration (monitoring/prometheus.yml) and rules (monitoring/alerts.yml).

Steps: read .run/stack.env (the running stack's URLs), DLOCK_EXECUTOR_METRICS from the
environment (`make monitor DLOCK_EXECUTOR_METRICS=…` or an exported variable) over the file's →
write .run/monitor/: the shipped config (https and the stack's CA added under TLS), the rules,
and targets/<job>.json per scrape job → exec `prometheus` in the foreground on
127.0.0.1:MONITOR_PORT (default 9090), its data in .run/monitor/data. Ctrl-C stops it; the stack
keeps running.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from urllib.parse import urlsplit

import yaml

from devstack.common import PROJECT, say
from devstack.envfile import read_env, run_dir

MONITORING = PROJECT / "monitoring"
# scrape job (alerts.yml's name) -> the stack env's URL list for it
JOB_URL_ENV = {
    "lock-server": "LOCK_SERVER_URL",
    "payment-resource": "PAYMENTS_URL",
    "rail-proxy": "RAIL_PROXY_URL",
    "rail-stub": "RAIL_STUB_URL",
    "admin": "ADMIN_URL",
}
EXECUTOR_ENV = "DLOCK_EXECUTOR_METRICS"  # comma-separated host:port of executors' /metrics


def targets(env: dict[str, str]) -> dict[str, list[str]]:
    """host:port per scrape job, from the stack env (URL lists are comma-separated)."""
    found = {
        job: [urlsplit(u.strip()).netloc for u in env.get(var, "").split(",") if u.strip()]
        for job, var in JOB_URL_ENV.items()
    }
    found["executor"] = [t.strip() for t in env.get(EXECUTOR_ENV, "").split(",") if t.strip()]
    return found


def prepare(env: dict[str, str], workdir: Path) -> Path:
    """Write the config, the rules and the target files into `workdir`; the config's path."""
    (workdir / "targets").mkdir(parents=True, exist_ok=True)
    config = yaml.safe_load((MONITORING / "prometheus.yml").read_text())
    tls = env.get("DLOCK_TLS") == "1"
    for job in config["scrape_configs"]:
        # the executor's own metrics server speaks plain HTTP (prometheus_client's, in its pod;
        # k8s/monitoring/pod-monitor.yaml scrapes it so too)
        if tls and job["job_name"] != "executor":
            job["scheme"] = "https"
            if env.get("DLOCK_CA_BUNDLE"):
                job["tls_config"] = {"ca_file": env["DLOCK_CA_BUNDLE"]}
    for job, hosts in targets(env).items():
        body = [{"targets": hosts, "labels": {}}] if hosts else []
        (workdir / "targets" / f"{job}.json").write_text(json.dumps(body))
    shutil.copyfile(MONITORING / "alerts.yml", workdir / "alerts.yml")
    path = workdir / "prometheus.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def command(config: Path, workdir: Path, port: int) -> list[str]:
    binary = shutil.which("prometheus")
    if binary is None:
        raise SystemExit("dlock: prometheus is missing: make sysdeps installs Debian's package")
    return [
        binary,
        f"--config.file={config}",
        f"--storage.tsdb.path={workdir / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]


def main() -> None:
    run = run_dir()
    if not (run / "stack.env").exists():
        sys.stderr.write("dlock: no running stack (.run/stack.env): make up first\n")
        raise SystemExit(2)
    env = read_env(run / "stack.env")
    if os.environ.get(EXECUTOR_ENV):  # the caller's executors, given on the command line
        env[EXECUTOR_ENV] = os.environ[EXECUTOR_ENV]
    workdir = run / "monitor"
    config = prepare(env, workdir)
    port = int(os.environ.get("MONITOR_PORT") or 9090)
    say(f"prometheus on http://127.0.0.1:{port} (config {config}; Ctrl-C stops it)")
    argv = command(config, workdir, port)
    os.execv(argv[0], argv)  # noqa: S606 - the fixed prometheus argv, no shell


if __name__ == "__main__":
    main()
