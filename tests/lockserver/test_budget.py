"""The per-caller retry budget, with an injected clock (no server needed)."""

from __future__ import annotations

import uuid

import pytest

from dlock.errors import ApiError, Code
from lockserver.budget import RetryBudget


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_budget_refuses_after_n_contended_attempts_and_recovers_after_the_window():
    clock = FakeClock()
    budget = RetryBudget(budget=3, window_ms=1_000, clock=clock)
    caller = {"session_id": uuid.uuid4(), "key": "payout:a"}
    for _ in range(3):
        budget.check(**caller)
        budget.spend(**caller)
        clock.now += 0.1
    with pytest.raises(ApiError) as refused:
        budget.check(**caller)
    assert refused.value.code is Code.CONTENTION_EXCEEDED
    assert refused.value.status == 429
    # The oldest unit (spent at t=100.0) leaves the window at t=101.0; now is 100.3.
    assert 690 <= refused.value.retry_after_ms <= 702
    clock.now = 101.01
    budget.check(**caller)  # one unit freed


def test_budget_is_per_session_and_key():
    clock = FakeClock()
    budget = RetryBudget(budget=1, window_ms=1_000, clock=clock)
    session = uuid.uuid4()
    budget.spend(session_id=session, key="a")
    with pytest.raises(ApiError):
        budget.check(session_id=session, key="a")
    budget.check(session_id=session, key="b")
    budget.check(session_id=uuid.uuid4(), key="a")


def test_idle_callers_are_forgotten():
    clock = FakeClock()
    budget = RetryBudget(budget=5, window_ms=1_000, clock=clock)
    for _ in range(100):
        budget.spend(session_id=uuid.uuid4(), key="k")
    clock.now += 2
    budget.spend(session_id=uuid.uuid4(), key="k")
    assert len(budget._spent) == 1
