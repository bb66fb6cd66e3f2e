"""The executor's per-account contention delays stay bounded: delays that ran out are pruned, so
a long-running executor that meets contention on ever new accounts does not grow without end
(before, `contended_until` kept every account it had ever seen contended)."""

from __future__ import annotations

from dlock.client import DlockError
from executor.backoff import PRUNE_MIN, AccountBackoff
from executor.picking import CONTENDED_PRUNE_MIN, Picker
from executor.section import Outcome


def picker() -> Picker:
    return Picker(
        api=None,  # type: ignore[arg-type] - no call is made
        pace=None,  # type: ignore[arg-type]
        owner_id="bounds",
        batch=4,
        concurrency=2,
        idle_sleep_s=0.1,
    )


def contended(account_id: str) -> Outcome:
    busy = DlockError("held elsewhere", code="LOCK_CONTENDED", retry_after_ms=50)
    return Outcome(
        "lock_contended",
        {"accountId": account_id, "payoutId": f"p-{account_id}"},
        refusal=False,
        contention=busy,
    )


def test_contention_delays_that_ran_out_are_pruned():
    picking = picker()
    # delays long past (monotonic time 0), as many as a day's worth of contended accounts
    picking.contended_until = {f"old-{n}": 0.0 for n in range(10 * CONTENDED_PRUNE_MIN)}
    picking.record(contended("fresh"))
    assert list(picking.contended_until) == ["fresh"]


def test_delays_still_running_are_kept_and_the_next_prune_waits_for_twice_as_many():
    picking = picker()
    far = float("inf")  # delays that have not run out
    picking.contended_until = {f"live-{n}": far for n in range(CONTENDED_PRUNE_MIN)}
    picking.record(contended("one-more"))
    assert len(picking.contended_until) == CONTENDED_PRUNE_MIN + 1
    assert picking.prune_at == 2 * (CONTENDED_PRUNE_MIN + 1)


def test_account_backoff_forgets_refusals_long_over_but_keeps_stuck_accounts():
    now = [0.0]
    backoff = AccountBackoff(initial_s=0.5, max_s=4.0, give_up_steps=3, clock=lambda: now[0])
    for _ in range(3):  # backed off for good: stays, whatever the clock says
        backoff.note(account_id="stuck", payout_id="p", outcome="fenced_out")
    for n in range(PRUNE_MIN):  # one refusal each, never repeated: no delay, nothing to keep
        backoff.note(account_id=f"once-{n}", payout_id=f"p{n}", outcome="not_claimable")
    now[0] = 100.0  # every delay long over
    backoff.note(account_id="next", payout_id="q", outcome="not_claimable")
    assert len(backoff) == 2
    assert backoff.stuck() == {"stuck": "fenced_out"}
