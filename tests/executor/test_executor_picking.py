"""Issue 17.3: picking feeds N slots. A queue whose every candidate waits on an account already
in flight here is re-listed from P1 (so a free slot starts on another account), without queueing
any payout twice."""

from __future__ import annotations

import pytest

from executor.worker import Executor
from tests.executor.conftest import account_ids, owner_id, payout_ids, seed, states

pytestmark = [pytest.mark.live]


def test_a_queue_waiting_on_a_busy_account_is_relisted(exec_stack):
    seeded = seed(exec_stack, accounts=2, per_account=2, balance=10_000, amount=100)
    ids, (busy, other) = payout_ids(seeded), account_ids(seeded)
    executor = Executor(
        owner_id=owner_id("exec-pick"),
        lock_url=exec_stack.env["LOCK_SERVER_URL"],
        payments_url=exec_stack.env["PAYMENTS_URL"],
        rail_proxy_url=exec_stack.env["RAIL_PROXY_URL"],
        concurrency=2,
    )
    listed = executor.api.list_payouts("PENDING", max_items=500)
    executor.picker.queue.extend(c for c in listed if c.account_id == busy and c.payout_id in ids)
    assert len(executor.picker.queue) == 2

    picked = executor.picker.pick(busy_accounts={busy})

    # Before: a non-empty queue was never re-listed, so this slot stayed idle (None).
    assert picked is not None and picked.account_id != busy and picked.state == "PENDING"
    queued = [c.payout_id for c in executor.picker.queue]
    assert len(queued) == len(set(queued)) and picked.payout_id not in queued
    assert sum(c.account_id == busy for c in executor.picker.queue) == 2  # still queued, once each
    assert other in {c.account_id for c in executor.picker.queue} | {picked.account_id}

    executor.picker.queue.clear()
    assert executor.run(until_idle=True) == 0
    assert set(states(exec_stack, ids).values()) == {"POSTED"}
