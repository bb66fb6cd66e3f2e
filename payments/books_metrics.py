"""Gauges payments reads from paydb at scrape time about work that waits (ROLE=payments only):

  payout_backlog_oldest_age_seconds{state}   age of the oldest PENDING payout (since created) and
                                             of the oldest CLAIMED one (since it last moved);
                                             0 when there is none. Exported by payment-resource
                                             itself, so a backlog is seen with no executor at all.
  rail_recoveries_open                       rail recoveries recorded and not yet closed
  rail_recovery_oldest_open_age_seconds      age of the oldest of them; 0 when there is none

One statement (two index-bounded aggregates and one over the small open-recovery set) under a
short statement timeout; when paydb does not answer in time the series are left out of that
scrape (the rest of /metrics still answers) and a WARNING is logged.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from django.db import DatabaseError, connections, transaction
from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import GaugeMetricFamily

from dlock.dbrouter import alias_for

logger = logging.getLogger(__name__)

SCRAPE_TIMEOUT_MS = 1_000
TIMEOUT_SQL = "SET LOCAL statement_timeout = %s"
# min(created_at) per state walks payout_state_page_idx (state, created_at); CLAIMED payouts are
# the in-flight few, so min(updated_at) over them is cheap; open recoveries are a handful.
WAITING_SQL = """
SELECT COALESCE(EXTRACT(EPOCH FROM clock_timestamp() - (
           SELECT min(created_at) FROM payout WHERE state = 'PENDING')), 0),
       COALESCE(EXTRACT(EPOCH FROM clock_timestamp() - (
           SELECT min(updated_at) FROM payout WHERE state = 'CLAIMED')), 0),
       (SELECT count(*) FROM rail_recovery WHERE status = 'OPEN'),
       COALESCE(EXTRACT(EPOCH FROM clock_timestamp() - (
           SELECT min(recorded_at) FROM rail_recovery WHERE status = 'OPEN')), 0)
"""
BACKLOG_HELP = "Age of the oldest payout waiting in this state (paydb, read at scrape); 0: none."
OPEN_HELP = "Rail recoveries recorded and not yet closed (RECOVERED or WRITTEN_OFF)."
OLDEST_HELP = "Age of the oldest open rail recovery in seconds; 0 when none is open."


def waiting() -> tuple[float, float, int, float]:
    """(oldest PENDING age, oldest CLAIMED age, open recoveries, oldest open recovery age)."""
    alias = alias_for("payments")
    with transaction.atomic(using=alias), connections[alias].cursor() as cur:
        cur.execute(TIMEOUT_SQL, [SCRAPE_TIMEOUT_MS])
        cur.execute(WAITING_SQL)
        pending, claimed, open_count, oldest = cur.fetchone()
    return float(pending), float(claimed), int(open_count), float(oldest)


def _families() -> list[GaugeMetricFamily]:
    return [
        GaugeMetricFamily("payout_backlog_oldest_age_seconds", BACKLOG_HELP, labels=["state"]),
        GaugeMetricFamily("rail_recoveries_open", OPEN_HELP),
        GaugeMetricFamily("rail_recovery_oldest_open_age_seconds", OLDEST_HELP),
    ]


class WaitingWorkCollector:
    def describe(self) -> Iterator[GaugeMetricFamily]:
        # Without describe() the registry would collect (query paydb) at registration.
        yield from _families()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            pending, claimed, open_count, oldest = waiting()
        except DatabaseError as exc:
            logger.warning("backlog and recovery gauges not collected: %s", type(exc).__name__)
            return
        backlog, count, age = _families()
        backlog.add_metric(["PENDING"], pending)
        backlog.add_metric(["CLAIMED"], claimed)
        count.add_metric([], open_count)
        age.add_metric([], oldest)
        yield from (backlog, count, age)


_registered: set[int] = set()


def register(registry: CollectorRegistry = REGISTRY) -> None:
    """Register the collector once per registry (ready() may run again in tests)."""
    if id(registry) not in _registered:
        _registered.add(id(registry))
        registry.register(WaitingWorkCollector())
