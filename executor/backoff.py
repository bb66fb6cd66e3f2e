"""How fast the executor goes: per account (`AccountBackoff`), and per process (`Pace`: a
503/429 slow-down and outage episodes per peer).

An account whose payout was FENCED_OUT while recovering, or refused the same way twice in a row,
is left alone for a bounded, jittered, exponentially growing delay (0.5 s, 1 s, 2 s, … ≤ 30 s)
while every other account keeps flowing. Each step logs one `executor_backoff` event and counts
`executor_backoff_total{reason}`; progress on the account clears it. A step count at or above
`give_up_steps` marks the account "stuck": `--until-idle` exits non-zero when only such work is
left, naming the payouts.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dlock.budgets import BACKOFF_INITIAL_S
from dlock.client import DlockError, ServiceUnreachable, retry_delay_s
from dlock.logs import log_event
from dlock.metrics import executor_backoff, executor_peer_unreachable

# Outcomes that moved the payout (or finished it): the account is healthy again.
PROGRESS = ("posted", "failed", "ambiguous")
# Refusals that repeat identically when nothing changes; twice in a row is a back-off step.
REFUSALS = ("not_claimable", "duplicate", "error")
# Refused once is enough: retrying a fenced-out section at full speed floods incident events.
IMMEDIATE = ("fenced_out",)
# The per-account table is pruned once it holds more than this many accounts.
PRUNE_MIN = 1_024


@dataclass
class _Account:
    step: int = 0
    until: float = 0.0
    reason: str | None = None
    last_refusal: str | None = None
    payout_id: str | None = None


class AccountBackoff:
    """Thread-safe back-off state per account; clock and randomness injectable for tests."""

    def __init__(
        self,
        *,
        initial_s: float = 0.5,
        max_s: float = 30.0,
        give_up_steps: int = 3,
        clock: Callable[[], float] = time.monotonic,
        random_fn: Callable[[], float] = random.random,
    ) -> None:
        self.initial_s = initial_s
        self.max_s = max_s
        self.give_up_steps = give_up_steps
        self.clock = clock
        self.random_fn = random_fn
        self._accounts: dict[str, _Account] = {}
        self._mutex = threading.Lock()
        # Pruned whenever it outgrows this (then twice what is left): bounded growth.
        self._prune_at = PRUNE_MIN

    def __len__(self) -> int:
        return len(self._accounts)

    def _prune(self) -> None:
        """Forget accounts whose last delay ran out more than `max_s` ago (a first refusal that
        was never repeated, a back-off long over), unless they are stuck. Called with the
        mutex held."""
        horizon = self.clock() - self.max_s
        self._accounts = {
            a: s
            for a, s in self._accounts.items()
            if s.until > horizon or s.step >= self.give_up_steps
        }
        self._prune_at = max(PRUNE_MIN, 2 * len(self._accounts))

    def blocked(self, account_id: str) -> bool:
        """True while the account's current back-off delay runs."""
        with self._mutex:
            state = self._accounts.get(account_id)
            return state is not None and state.until > self.clock()

    def stuck(self) -> dict[str, str]:
        """accountId → reason for accounts backed off `give_up_steps` times or more."""
        with self._mutex:
            return {
                account_id: s.reason or "?"
                for account_id, s in self._accounts.items()
                if s.step >= self.give_up_steps
            }

    def note(self, *, account_id: str, payout_id: str, outcome: str) -> float | None:
        """Record a section's outcome; returns the delay when it started a back-off step."""
        with self._mutex:
            if len(self._accounts) > self._prune_at:
                self._prune()
            state = self._accounts.setdefault(account_id, _Account())
            if outcome in PROGRESS:
                self._accounts.pop(account_id, None)
                return None
            repeated = outcome in REFUSALS and state.last_refusal == outcome
            state.last_refusal = outcome if outcome in REFUSALS else None
            if outcome not in IMMEDIATE and not repeated:
                return None
            state.step += 1
            base = min(self.max_s, self.initial_s * 2 ** (state.step - 1))
            delay = base * (0.5 + 0.5 * self.random_fn())
            state.until = self.clock() + delay
            state.reason = outcome
            state.payout_id = payout_id
            step = state.step
        executor_backoff.labels(reason=outcome).inc()
        log_event(
            "executor_backoff",
            level=logging.WARNING,
            accountId=account_id,
            payoutId=payout_id,
            reason=outcome,
            step=step,
            delaySeconds=round(delay, 3),
        )
        return delay


# A service that does not answer (refused, timed out, 503/504): the whole process waits a
# jittered, exponentially growing delay before its next new section, 0.1 s → 5 s.
OUTAGE_INITIAL_S = 0.1
OUTAGE_MAX_S = 5.0


@dataclass
class _Episode:
    started: float
    attempts: int = 0


class Pace:
    """The process-wide pace, shared by the picker, the sections and the dispatcher.

    A 503/429 from any service slows every new section down (`slow_until`). A peer that does
    not answer is an outage episode: a bounded, jittered back-off while it lasts, one WARNING
    when it starts, `executor_peer_unreachable_total{peer}` per failed attempt, and one
    `executor_peer_recovered` line when a call to it succeeds again; `outage` tells the
    dispatcher the run is waiting one out, not idle (--until-idle must not give up on it).
    """

    def __init__(
        self,
        *,
        initial_s: float = OUTAGE_INITIAL_S,
        max_s: float = OUTAGE_MAX_S,
        clock: Callable[[], float] = time.monotonic,
        random_fn: Callable[[], float] = random.random,
    ) -> None:
        self.initial_s = initial_s
        self.max_s = max_s
        self.clock = clock
        self.random_fn = random_fn
        self.slow_until = 0.0  # on `clock`: no new section before then
        self.outage = False
        self._episodes: dict[str, _Episode] = {}
        self._mutex = threading.Lock()

    def slowed(self) -> bool:
        return self.clock() < self.slow_until

    def slow_down(self, exc: DlockError) -> None:
        """A 503/429 from any service slows the whole process: no new section until then."""
        if exc.status not in (429, 503):
            return
        delay = retry_delay_s(exc, BACKOFF_INITIAL_S * 2, cap_s=5.0) * (0.5 + self.random_fn())
        self.slow_until = max(self.slow_until, self.clock() + delay)

    def failed(self, peer: str, event: str, exc: DlockError, fields: dict[str, Any]) -> None:
        """A call to `peer` went wrong. Unreachable (no answer, or 503/504): an outage episode,
        `event` logged (WARNING) only when this attempt starts it; any other error: `event`
        logged as a WARNING."""
        self.slow_down(exc)
        if not unreachable(exc):
            log_event(event, level=logging.WARNING, code=exc.code, error=str(exc), **fields)
            return
        with self._mutex:
            episode = self._episodes.get(peer)
            first = episode is None
            if episode is None:
                episode = self._episodes[peer] = _Episode(started=self.clock())
            episode.attempts += 1
            base = min(self.max_s, self.initial_s * 2 ** (episode.attempts - 1))
            delay = base * (0.5 + 0.5 * self.random_fn())
        executor_peer_unreachable.labels(peer=peer).inc()
        if first:
            log_event(
                event,
                level=logging.WARNING,
                peer=peer,
                outage="started",
                code=exc.code,
                error=str(exc),
                **fields,
            )
        self.slow_until = max(self.slow_until, self.clock() + delay)
        self.outage = True  # waited out, never mistaken for idleness (--until-idle)

    def answered(self, peer: str) -> None:
        """A call to `peer` succeeded: end its episode (one line), if one was running."""
        if peer not in self._episodes:  # the hot path: no lock when nothing is wrong
            return
        with self._mutex:
            episode = self._episodes.pop(peer, None)
        if episode is not None:
            log_event(
                "executor_peer_recovered",
                level=logging.INFO,
                peer=peer,
                failedAttempts=episode.attempts,
                outageSeconds=round(self.clock() - episode.started, 3),
            )


def unreachable(exc: DlockError) -> bool:
    """The service did not answer (refused, timed out, dropped) or said 503/504: an outage."""
    return isinstance(exc, ServiceUnreachable) or exc.status in (503, 504)
