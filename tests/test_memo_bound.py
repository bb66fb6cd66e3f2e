"""A write-once map (dlock.memo: payout → account in payments and the rail proxy, session →
credential in the lock server) holds what its hot path re-reads within seconds, not hours: a
soak at 8 payouts/s saw each proxy's map grow ~250 B per payout, ~110 kB/min of RSS, toward
100 000 entries (~25 MB per process, reached after three and a half hours)."""

from __future__ import annotations

import tracemalloc
import uuid

from dlock.memo import WriteOnceMap


def test_a_default_map_fed_far_past_its_bound_holds_a_few_megabytes():
    tracemalloc.start()
    try:
        kept = WriteOnceMap()
        before = tracemalloc.get_traced_memory()[0]
        for i in range(120_000):
            kept.remember(uuid.UUID(int=i), f"acct-{i:016x}")
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(kept) == 16_384
    assert grown < 6 * 1024 * 1024


def test_the_newest_facts_are_the_ones_kept():
    kept = WriteOnceMap()
    for i in range(20_000):
        kept.remember(i, str(i))
    assert kept.get(19_999) == "19999"
    assert kept.get(20_000 - 16_384) == str(20_000 - 16_384)
    assert kept.get(20_000 - 16_384 - 1) is None
