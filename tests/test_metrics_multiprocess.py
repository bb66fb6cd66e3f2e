"""Several gunicorn workers in one pod: /metrics sums every worker (prometheus_client
multiprocess mode, settings/gunicorn.py + dlock.metrics.scrape_registry)."""

from __future__ import annotations

import re
from collections import Counter

import pytest
import requests
from prometheus_client import CONTENT_TYPE_LATEST

from devstack.common import free_port
from devstack.roles import RoleProcess
from tests.conftest import migrated_live_databases
from tests.test_roles_live import OWN_SERIES

pytestmark = pytest.mark.live

REQUESTS = 60
GET_TOTAL = re.compile(r'^django_http_requests_total_by_method_total\{method="GET"\} (\S+)$', re.M)


def _samples(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def test_two_workers_export_one_summed_series_each(live_stack, tmp_path):
    env = {**live_stack.env, **migrated_live_databases("multiproc")}
    directory = tmp_path / "prom"
    directory.mkdir()
    (directory / "counter_999999.db").write_bytes(b"stale")  # an earlier master's file
    env = {**env, "GUNICORN_WORKERS": "2", "PROMETHEUS_MULTIPROC_DIR": str(directory)}
    proc = RoleProcess("payments", free_port(), env, tmp_path / "payments.log").start()
    try:
        for _ in range(REQUESTS):  # a fresh connection each: the kernel spreads them
            with requests.Session() as session:
                answer = session.get(f"{proc.url}/health/live", timeout=5)
                assert answer.status_code == 200
        scrapes = [requests.get(f"{proc.url}/metrics", timeout=5) for _ in range(6)]
        files = sorted(p.name for p in directory.glob("counter_*.db"))
        pids = {name.split("_", 1)[1].removesuffix(".db") for name in files}
    finally:
        proc.stop()
    assert "counter_999999.db" not in files  # emptied at start: nothing stale is summed in
    assert len(pids) == 2, files  # both workers counted requests in their own files
    totals = []
    for scrape in scrapes:
        assert scrape.status_code == 200
        assert scrape.headers["Content-Type"] == CONTENT_TYPE_LATEST  # as with one worker
        text = scrape.text
        # One sample per name and label set, whichever worker answered.
        series = Counter(line.rsplit(" ", 1)[0] for line in _samples(text))
        assert [name for name, n in series.items() if n > 1] == []
        for own in OWN_SERIES["payments"]:
            assert own in text, own
        assert "process_cpu_seconds_total" in text
        # Only the request series dlock.prometheus makes: none at 0 from a worker's files.
        assert "django_http_requests_body_total_bytes" not in text
        assert "django_http_responses_before_middlewares_total" not in text
        match = GET_TOTAL.search(text)
        assert match, text[:2000]
        totals.append(float(match.group(1)))
    # Summed over both workers: every request counted, whichever worker answers the scrape
    # (each scrape is a GET itself, so the total only grows).
    assert totals[0] >= REQUESTS
    assert totals == sorted(totals)
