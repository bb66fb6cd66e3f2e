"""Alerting that ships: monitoring/alerts.yml passes `promtool test rules`, the Prometheus
Operator's copy (k8s/monitoring/) says the same, and the dashboard graphs what the issue names."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
import yaml

from devstack import PROJECT

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
    assert found["DlockFencedOut"]["labels"]["severity"] == "page"  # any fenced-out is a page
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
    monitor = yaml.safe_load((K8S_MONITORING / "pod-monitor.yaml").read_text())
    assert monitor["kind"] == "PodMonitor"
    assert monitor["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name": "dlock"}
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert (endpoint["port"], endpoint["path"]) == ("http-metrics", "/metrics")
    for name in ("lock-server", "payment-resource", "rail-proxy", "rail-stub", "executor"):
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
