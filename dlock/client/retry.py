"""Bounded, jittered retry of the retry-safe lock-server codes (FR-28)."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any, TypeVar

from dlock.budgets import BACKOFF_INITIAL_S, BACKOFF_MAX_S, BUDGETS
from dlock.client.errors import (
    ContentionExceeded,
    DlockError,
    LockContended,
    NotLeader,
    Overloaded,
)

T = TypeVar("T")


RETRY_SAFE_LOCK_ERRORS: tuple[type[DlockError], ...] = (
    LockContended,
    ContentionExceeded,
    NotLeader,
    Overloaded,
)


class RetryPolicy:
    """Bounded, jittered exponential retry of the retry-safe lock-server codes only (FR-28).

    Delays grow 50 ms → 1 s; CONTENTION_EXCEEDED, NOT_LEADER and OVERLOADED wait at least the
    server's retryAfterMillis (LOCK_CONTENDED's is the holder's expiry hint: the jittered
    schedule already starts below it and the server-side wait covers the rest). Anything
    else, and anything the server marked retrySafe=false, fails closed on the first attempt.
    `sleep` and `random` are injectable so tests control time.
    """

    def __init__(
        self,
        max_retries: int = BUDGETS["lock.acquire"].retries,
        *,
        initial_delay: float = BACKOFF_INITIAL_S,
        max_delay: float = BACKOFF_MAX_S,
        backoff: float = 2.0,
        jitter: float = 0.5,
        retry_on: tuple[type[DlockError], ...] = RETRY_SAFE_LOCK_ERRORS,
        sleep: Callable[[float], None] = time.sleep,
        random_fn: Callable[[], float] = random.random,
    ) -> None:
        self.max_retries = max_retries
        self.initial_delay = initial_delay
        self.max_delay = max_delay
        self.backoff = backoff
        self.jitter = jitter
        self.retry_on = retry_on
        self.sleep = sleep
        self.random_fn = random_fn

    def delay(self, attempt: int, exc: DlockError) -> float:
        """Seconds to wait before retry number `attempt + 1`."""
        base = min(self.max_delay, self.initial_delay * self.backoff**attempt)
        wait = base * (1.0 - self.jitter * self.random_fn())
        if isinstance(exc, (ContentionExceeded, NotLeader, Overloaded)) and exc.retry_after_ms:
            wait = max(wait, exc.retry_after_ms / 1000.0)
        return wait

    def __call__(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        attempt = 0
        while True:
            try:
                return fn(*args, **kwargs)
            except self.retry_on as exc:
                if attempt >= self.max_retries or not exc.retry_safe:
                    raise
                self.sleep(self.delay(attempt, exc))
                attempt += 1


def retry_delay_s(exc: DlockError, floor_s: float, cap_s: float = BACKOFF_MAX_S * 5) -> float:
    """How long to wait before retrying after `exc`: at least the server's retryAfterMillis."""
    if exc.retry_after_ms:
        return min(cap_s, max(floor_s, exc.retry_after_ms / 1000.0))
    return floor_s
