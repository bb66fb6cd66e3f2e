"""Operator results kept in paydb, exported by the payments role's /metrics at scrape time.

  reconcile_ok                          1 when the latest `manage.py reconcile` run found every
                                        invariant intact, 0 when one broke (absent: never ran)
  reconcile_last_run_timestamp_seconds  when that run finished (alert when stale)
  fence_repaired_total                  `manage.py repair_fence` repairs ever made (audit rows)

The reconciler and repair_fence are short-lived ops processes nobody scrapes; their verdicts
are rows (`reconcile_run`, `fence_repair`), so any payments replica exports the same truth.
Registered by PaymentsConfig.ready() on the default registry, payments role only.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from django.db import DatabaseError
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import REGISTRY, CollectorRegistry

from dlock.dbrouter import alias_for

logger = logging.getLogger(__name__)

OK_HELP = "1 when the latest reconcile run found every invariant intact, else 0."
LAST_RUN_HELP = "When the latest reconcile run finished (Unix seconds)."
REPAIRED_HELP = "Fence repairs made by `manage.py repair_fence` (fence_repair audit rows)."


class OperatorResultsCollector:
    """Reads the latest `reconcile_run` row and the `fence_repair` count at each scrape."""

    def describe(self) -> Iterator[Metric]:  # no database access at registration
        yield GaugeMetricFamily("reconcile_ok", OK_HELP)
        yield GaugeMetricFamily("reconcile_last_run_timestamp_seconds", LAST_RUN_HELP)
        yield CounterMetricFamily("fence_repaired", REPAIRED_HELP)

    def collect(self) -> Iterator[Metric]:
        from payments.models import FenceRepair, ReconcileRun

        alias = alias_for("payments")
        try:
            latest = (
                ReconcileRun.objects.using(alias)
                .order_by("-finished_at", "-run_id")
                .values("ok", "finished_at")
                .first()
            )
            repaired = FenceRepair.objects.using(alias).count()
        except DatabaseError as exc:  # paydb down: the scrape still answers, these go absent
            logger.warning("operator results unreadable from paydb: %s", type(exc).__name__)
            return
        if latest is not None:
            yield GaugeMetricFamily("reconcile_ok", OK_HELP, value=int(latest["ok"]))
            yield GaugeMetricFamily(
                "reconcile_last_run_timestamp_seconds",
                LAST_RUN_HELP,
                value=latest["finished_at"].timestamp(),
            )
        yield CounterMetricFamily("fence_repaired", REPAIRED_HELP, value=repaired)


_registered: set[int] = set()


def register(registry: CollectorRegistry = REGISTRY) -> None:
    """Register the collector once per registry (ready() may run again in tests)."""
    if id(registry) in _registered:
        return
    registry.register(OperatorResultsCollector())
    _registered.add(id(registry))
