"""Per-caller retry budget for contended acquires (C3 CONTENTION_EXCEEDED), backend-agnostic.

A caller is a (sessionId, key) pair. Each answer of 409 LOCK_CONTENDED spends one unit; once
LOCK_RETRY_BUDGET units were spent within the last LOCK_RETRY_WINDOW_MS, further acquires of
that key by that session answer 429 CONTENTION_EXCEEDED with retryAfterMillis = the time until
the oldest spent unit leaves the window. The ledger lives in the lock-server process (one
process per replica), so with N replicas a caller spreading retries over all of them gets at
most N budgets: a throttle, never a safety mechanism.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import deque
from collections.abc import Callable

from dlock.errors import ApiError, Code


class RetryBudget:
    def __init__(
        self, *, budget: int, window_ms: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.budget = budget
        self.window = window_ms / 1000
        self.clock = clock
        self._spent: dict[tuple[uuid.UUID, str], deque[float]] = {}
        self._guard = threading.Lock()
        self._next_sweep = 0.0

    def check(self, *, session_id: uuid.UUID, key: str) -> None:
        """Raise CONTENTION_EXCEEDED when this caller's budget for `key` is exhausted."""
        now = self.clock()
        with self._guard:
            spent = self._spent.get((session_id, key))
            if not spent:
                return
            self._trim(spent, now)
            if len(spent) >= self.budget:
                retry_after = max(1, int((spent[0] + self.window - now) * 1000) + 1)
                raise ApiError(
                    Code.CONTENTION_EXCEEDED,
                    f"retry budget of {self.budget} contended attempts per "
                    f"{int(self.window * 1000)} ms for this key is exhausted",
                    details={"key": key, "budget": self.budget},
                    retry_after_ms=retry_after,
                )

    def spend(self, *, session_id: uuid.UUID, key: str) -> None:
        now = self.clock()
        with self._guard:
            spent = self._spent.setdefault((session_id, key), deque())
            self._trim(spent, now)
            spent.append(now)
            if now >= self._next_sweep:
                self._sweep(now)

    def _trim(self, spent: deque[float], now: float) -> None:
        while spent and spent[0] <= now - self.window:
            spent.popleft()

    def _sweep(self, now: float) -> None:
        """Forget callers whose whole window lapsed (keeps memory bounded)."""
        self._next_sweep = now + self.window
        for caller in [c for c, s in self._spent.items() if not s or s[-1] <= now - self.window]:
            del self._spent[caller]
