"""Payments' own gauges, read from paydb at scrape time (ROLE=payments only).

`payouts_in_state{state}`: how many payouts are in each state (every state, 0 included), so the
quarantine (RAIL_AMBIGUOUS) and the pipeline can be alerted on and graphed by state. One
GROUP BY over the payout table per scrape; a database that does not answer within the
statement deadline leaves the series out of that scrape (the request metrics still answer).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from django.db import connections
from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import GaugeMetricFamily

from dlock.dbrouter import alias_for
from payments.models import PayoutState

STATES_SQL = "SELECT state, count(*) FROM payout GROUP BY state"
logger = logging.getLogger(__name__)


def payout_state_counts() -> dict[str, int]:
    """Raw SQL: one aggregate read, no model instances, on the payments alias."""
    with connections[alias_for("payments")].cursor() as cur:
        cur.execute(STATES_SQL)
        counts = {str(state): int(n) for state, n in cur.fetchall()}
    return {state: counts.get(state, 0) for state in PayoutState.values}


def _family() -> GaugeMetricFamily:
    return GaugeMetricFamily(
        "payouts_in_state", "Payouts in each state (paydb, read at scrape).", labels=["state"]
    )


class PayoutStateCollector:
    def describe(self) -> Iterator[GaugeMetricFamily]:
        # Without describe() the registry would collect (query paydb) at registration.
        yield _family()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            counts = payout_state_counts()
        except Exception as exc:
            logger.warning("payouts_in_state not collected: %s", exc)
            return
        family = _family()
        for state, n in counts.items():
            family.add_metric([state], n)
        yield family


_registered: set[int] = set()


def register_payments_collectors(registry: CollectorRegistry = REGISTRY) -> None:
    if id(registry) not in _registered:
        _registered.add(id(registry))
        registry.register(PayoutStateCollector())
