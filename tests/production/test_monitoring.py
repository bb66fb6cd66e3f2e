"""Alerting that ships: monitoring/alerts.yml passes `promtool test rules`, the Prometheus
Operator's copy (k8s/monitoring/) says the same, and the dashboard graphs what the issue names."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
import yaml

from devstack.common import PROJECT

MONITORING = PROJECT / "monitoring"
K8S_MONITORING = PROJECT / "k8s" / "monitoring"
ALERTS = yaml.safe_load((MONITORING / "alerts.yml").read_text())
EXPECTED_ALERTS = {
    "DlockFencedOut": "lock_fenced_out_total",
    "DlockRailDuplicateAttempted": "rail_duplicate_attempted_total",
    "DlockQuarantineNotEmpty": 'payouts_in_state{state="RAIL_AMBIGUOUS"}',
    "DlockPayoutBacklogOld": "payout_backlog_oldest_age_seconds",
    "DlockRailRecoveryOpenTooLong": "rail_recovery_oldest_open_age_seconds",
    "DlockLockServerDown": 'up{job="lock-server"}',
    "DlockPaymentResourceDown": 'up{job="payment-resource"}',
    "DlockRailProxyDown": 'up{job="rail-proxy"}',
    "DlockRailStubDown": 'up{job="rail-stub"}',
    "DlockExecutorsAbsent": 'up{job="executor"}',
    "DlockInstanceDown": "up{job=~",
    "DlockReconcileFailed": "reconcile_ok",
    "DlockReconcileStale": "reconcile_last_run_timestamp_seconds",
    "DlockLockNotLeader": 'outcome="not_leader"',
    "DlockRequestsShed": "dlock_requests_shed_total",
    "DlockAdminLockouts": "admin_lockouts_total",
}


def promtool(*args: str) -> subprocess.CompletedProcess:
    binary = shutil.which("promtool")
    if binary is None:
        pytest.fail("promtool is missing: scripts/sysdeps.sh installs Debian's prometheus")
    return subprocess.run(
        [binary, *args], cwd=MONITORING, capture_output=True, text=True, timeout=120
    )


def rules() -> dict[str, dict]:
    return {r["alert"]: r for g in ALERTS["groups"] for r in g["rules"]}


def test_the_rules_file_is_valid_and_its_promtool_unit_tests_pass():
    checked = promtool("check", "rules", "alerts.yml")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = promtool("test", "rules", "alerts_test.yml")
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


def test_every_alert_the_issue_names_exists_with_a_severity_and_a_unit_test():
    found = rules()
    for alert, series in EXPECTED_ALERTS.items():
        assert series in found[alert]["expr"], alert
        assert found[alert]["labels"]["severity"] in ("page", "ticket")
    # A fenced-out write is the fence working: repeated ones are a ticket, never a page.
    assert found["DlockFencedOut"]["labels"]["severity"] == "ticket"
    assert "executor" in found["DlockExecutorsAbsent"]["expr"]
    assert "payout_backlog_oldest_age_seconds" in found["DlockExecutorsAbsent"]["expr"]
    assert found["DlockQuarantineNotEmpty"]["for"] == "15m"
    tests = yaml.safe_load((MONITORING / "alerts_test.yml").read_text())["tests"]
    tested = {case["alertname"] for t in tests for case in t["alert_rule_test"]}
    assert tested == set(found)
    fires = {
        case["alertname"] for t in tests for case in t["alert_rule_test"] if case["exp_alerts"]
    }
    quiet = {
        case["alertname"] for t in tests for case in t["alert_rule_test"] if not case["exp_alerts"]
    }
    assert fires == quiet == set(found)  # each alert: a case that fires and one that must not


def test_the_prometheus_rule_in_k8s_carries_exactly_the_rules_file():
    rule = yaml.safe_load((K8S_MONITORING / "prometheus-rule.yaml").read_text())
    assert rule["kind"] == "PrometheusRule"
    assert rule["spec"]["groups"] == ALERTS["groups"]
    kustomization = yaml.safe_load((K8S_MONITORING / "kustomization.yaml").read_text())
    assert set(kustomization["resources"]) == {"prometheus-rule.yaml", "pod-monitor.yaml"}


def test_the_pod_monitor_scrapes_the_metrics_port_every_dlock_workload_exposes():
    monitors = [
        d for d in yaml.safe_load_all((K8S_MONITORING / "pod-monitor.yaml").read_text()) if d
    ]
    scheme_of = {}
    for monitor in monitors:
        assert monitor["kind"] == "PodMonitor"
        assert monitor["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name": "dlock"}
        (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
        assert (endpoint["port"], endpoint["path"]) == ("http-metrics", "/metrics")
        (components,) = monitor["spec"]["selector"]["matchExpressions"]
        for component in components["values"]:
            scheme_of[component] = endpoint.get("scheme", "http")
    # the server roles' metrics listener is their proxy's, on TLS (issue 38): scraped over https
    assert scheme_of == {
        "lock-server": "https",
        "payment-resource": "https",
        "rail-proxy": "https",
        "rail-stub": "https",
        "admin": "https",
        "executor": "http",
        "etcd": "http",
    }
    for name in ("lock-server", "payment-resource", "rail-proxy", "rail-stub", "admin", "executor"):
        (deployment,) = [
            d
            for d in yaml.safe_load_all((PROJECT / "k8s" / f"{name}.yaml").read_text())
            if d and d["kind"] == "Deployment"
        ]
        # the server pods publish it on their proxy sidecar, the executor on its own container
        containers = deployment["spec"]["template"]["spec"]["containers"]
        ports = [p for c in containers for p in c.get("ports", [])]
        assert "http-metrics" in {p["name"] for p in ports}, name


def test_the_dashboard_graphs_states_throughput_fencing_rail_locks_and_latency():
    dashboard = json.loads((MONITORING / "dashboard.json").read_text())
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p["targets"])
    for series in (
        "payouts_in_state",
        "payout_execute_total",
        "lock_fenced_out_total",
        "rail_submission_total",
        "lock_acquire_total",
        "django_http_requests_latency_seconds_by_view_method_bucket",
        "reconcile_ok",
    ):
        assert series in exprs, series
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])


def test_the_dashboard_reads_series_that_exist_when_what_they_watch_is_dead():
    panels = {
        p["title"]: p for p in json.loads((MONITORING / "dashboard.json").read_text())["panels"]
    }
    # payment-resource's backlog gauge, not the executors' own (gone with them)
    (oldest,) = panels["Oldest PENDING payout"]["targets"]
    assert oldest["expr"] == 'max(payout_backlog_oldest_age_seconds{state="PENDING"})'
    exprs = {t["expr"] for t in panels["Open rail recoveries"]["targets"]}
    assert exprs == {"max(rail_recoveries_open)", "max(rail_recovery_oldest_open_age_seconds)"}


def absent_jobs() -> set[str]:
    import re

    return {
        m.group(1)
        for r in rules().values()
        for m in re.finditer(r'absent\(up\{job="([^"]+)"\}', r["expr"])
    }


def test_the_shipped_scrape_config_names_every_job_the_rules_expect():
    config = yaml.safe_load((MONITORING / "prometheus.yml").read_text())
    jobs = {job["job_name"] for job in config["scrape_configs"]}
    assert (
        absent_jobs()
        == jobs
        == {
            "lock-server",
            "payment-resource",
            "rail-proxy",
            "rail-stub",
            "admin",
            "executor",
        }
    )
    assert config["rule_files"] == ["alerts.yml"]


def test_the_real_prometheus_loads_the_shipped_config_and_rules_with_the_jobs_named(tmp_path):
    """What `make monitor` runs (devstack.monitor), on a port of the reserved range."""
    import time

    import requests

    from devstack.common import free_port
    from devstack.monitor import command, prepare

    ports = {
        name: free_port() for name in ("lock", "pay", "proxy", "stub", "admin", "exec", "prom")
    }
    env = {
        "LOCK_SERVER_URL": f"http://127.0.0.1:{ports['lock']}",
        "PAYMENTS_URL": f"http://127.0.0.1:{ports['pay']}",
        "RAIL_PROXY_URL": f"http://127.0.0.1:{ports['proxy']}",
        "RAIL_STUB_URL": f"http://127.0.0.1:{ports['stub']}",
        "ADMIN_URL": f"http://127.0.0.1:{ports['admin']}",
        "DLOCK_EXECUTOR_METRICS": f"127.0.0.1:{ports['exec']}",
    }
    config = prepare(env, tmp_path)
    checked = promtool("check", "config", str(config))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    base = f"http://127.0.0.1:{ports['prom']}"
    proc = subprocess.Popen(
        command(config, tmp_path, ports["prom"]),
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "prometheus.log", "wb"),
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()
            try:
                if requests.get(f"{base}/-/ready", timeout=2).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            assert time.monotonic() < deadline, (tmp_path / "prometheus.log").read_text()
            time.sleep(0.2)
        while True:  # file_sd hands the targets over shortly after start
            active = requests.get(f"{base}/api/v1/targets", timeout=5).json()["data"]
            found = {(t["labels"]["job"], t["labels"]["instance"]) for t in active["activeTargets"]}
            if len(found) == 6 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert found == {
            ("lock-server", f"127.0.0.1:{ports['lock']}"),
            ("payment-resource", f"127.0.0.1:{ports['pay']}"),
            ("rail-proxy", f"127.0.0.1:{ports['proxy']}"),
            ("rail-stub", f"127.0.0.1:{ports['stub']}"),
            ("admin", f"127.0.0.1:{ports['admin']}"),
            ("executor", f"127.0.0.1:{ports['exec']}"),
        }
        assert {job for job, _ in found} == absent_jobs()
        groups = requests.get(f"{base}/api/v1/rules", timeout=5).json()["data"]["groups"]
        loaded = {r["name"] for g in groups for r in g["rules"]}
        assert loaded == set(rules())
    finally:
        proc.terminate()
        proc.wait(30)
