"""The reconciler's verdict reaches Prometheus: `manage.py reconcile` → payments' /metrics."""

from __future__ import annotations

import json
import re
import time

import pytest
import requests

from tests.executor.conftest import account_ids, paydb, seed

pytestmark = [pytest.mark.live, pytest.mark.slow]


def _scrape(stack) -> dict[str, float]:
    text = requests.get(f"{stack.url('payments')}/metrics", timeout=5).text
    found = {}
    for name in ("reconcile_ok", "reconcile_last_run_timestamp_seconds", "fence_repaired_total"):
        match = re.search(rf"^{name} (\S+)$", text, re.M)
        if match:
            found[name] = float(match.group(1))
    return found


def _latest_run(stack) -> tuple[bool, int, float]:
    with paydb(stack) as conn:
        return conn.execute(
            "SELECT ok, violations, extract(epoch FROM finished_at)::float8 FROM reconcile_run"
            " ORDER BY finished_at DESC, run_id DESC LIMIT 1"
        ).fetchone()


def _reconcile(stack, tmp_path):
    prom = tmp_path / "reconcile.prom"
    result = stack.manage("reconcile", "--json", "--metrics-file", str(prom), check=False)
    return result, prom


def test_each_reconcile_run_is_recorded_and_exported_by_payments(ops_stack, tmp_path):
    started = time.time()
    result, prom = _reconcile(ops_stack, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert json.loads(result.stdout)["ok"] is True

    ok, violations, finished = _latest_run(ops_stack)
    assert (ok, violations) == (True, 0) and started - 1 < finished < time.time() + 1
    scraped = _scrape(ops_stack)
    assert scraped["reconcile_ok"] == 1.0
    assert scraped["reconcile_last_run_timestamp_seconds"] == pytest.approx(finished, abs=1e-3)
    assert "reconcile_ok 1.0" in prom.read_text()  # the textfile output still works

    # A balance drifts from its ledger: the next run breaks, and the scrape says so.
    (account_id,) = account_ids(seed(ops_stack, accounts=1, per_account=0, balance=500, amount=1))
    with paydb(ops_stack) as conn:
        conn.execute(
            "UPDATE account SET balance_minor = balance_minor + 1 WHERE account_id = %s",
            (account_id,),
        )
    try:
        broken, _ = _reconcile(ops_stack, tmp_path)
        assert broken.returncode == 1, broken.stdout + broken.stderr
        ok, violations, later = _latest_run(ops_stack)
        assert ok is False and violations >= 1 and later >= finished
        scraped = _scrape(ops_stack)
        assert scraped["reconcile_ok"] == 0.0
        assert scraped["reconcile_last_run_timestamp_seconds"] == pytest.approx(later, abs=1e-3)
    finally:
        with paydb(ops_stack) as conn:
            conn.execute(
                "UPDATE account SET balance_minor = balance_minor - 1 WHERE account_id = %s",
                (account_id,),
            )


def test_a_no_write_run_records_nothing(ops_stack, tmp_path):
    _reconcile(ops_stack, tmp_path)
    before = _latest_run(ops_stack)
    result = ops_stack.manage(
        "reconcile", "--no-write", "--metrics-file", str(tmp_path / "r.prom"), check=False
    )
    assert result.returncode in (0, 1), result.stderr
    assert _latest_run(ops_stack) == before


def test_fence_repaired_total_counts_the_audit_rows(ops_stack):
    with paydb(ops_stack) as conn:
        (rows,) = conn.execute("SELECT count(*) FROM fence_repair").fetchone()
    assert _scrape(ops_stack)["fence_repaired_total"] == float(rows)
