"""Step 1 of a section, pick: a queue refilled from P1, spread over accounts (issue 17).

Mixed into `executor.worker.Executor`, whose state (queue, api, backoff, contention delays) it
reads; only the dispatcher thread calls it.
"""

from __future__ import annotations

import logging
import random
import time
from collections import deque
from collections.abc import Set as AbstractSet
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from dlock.client import DlockError, ServiceUnreachable
from dlock.logs import log_event
from dlock.metrics import payout_backlog_age

if TYPE_CHECKING:
    from executor.api import Api, Candidate
    from executor.backoff import AccountBackoff, PeerOutages

RECOVERABLE = ("RAIL_ACKED", "CLAIMED")
LIST_PAGE = 100
LIST_MAX = 500  # P1's largest `limit`
# How often a queue whose candidates all wait (account in flight here, or contended) is re-listed.
REFILL_S = 0.25


class Picker:
    """The picking half of the executor."""

    queue: deque[Candidate]
    api: Api
    backoff: AccountBackoff
    contended_until: dict[str, float]
    hands_off: set[str]
    backed_off: dict[str, str]
    next_refresh: float
    next_refill: float
    idle_sleep_s: float
    batch: int
    concurrency: int
    owner_id: str
    outage: bool
    round_progress: bool
    outages: PeerOutages

    def _note_outage(self, exc: DlockError) -> None:  # pragma: no cover - Executor's
        raise NotImplementedError

    def _peer_failed(
        self, peer: str, event: str, exc: DlockError, fields: dict[str, object]
    ) -> None:  # pragma: no cover - Executor's
        raise NotImplementedError

    # -- step 1: pick --------------------------------------------------------------------

    def pick(
        self,
        *,
        busy_accounts: AbstractSet[str] = frozenset(),
        busy_payouts: AbstractSet[str] = frozenset(),
    ) -> Candidate | None:
        """The next candidate on an account with nothing in flight here and no contention
        delay running. The P1 listing is re-read only when the queue ran dry, and, after a
        listing that found nothing, not more often than every idle_sleep."""
        now = time.monotonic()
        for candidate in list(self.queue):
            if candidate.account_id in busy_accounts:
                continue
            if self.contended_until.get(candidate.account_id, 0.0) > now:
                continue
            self.queue.remove(candidate)
            return candidate
        if now < self.next_refresh or (self.queue and now < self.next_refill):
            return None
        # Nothing eligible: re-list when the queue ran dry, and also (at most every REFILL_S)
        # when all it holds waits on accounts in flight here or contended: otherwise free slots
        # idle until those sections end (issue 17: the queue must feed N slots).
        self.refresh(busy_payouts)
        self.next_refill = now + REFILL_S
        found = bool(self.queue)
        self.next_refresh = now if found else now + self.idle_sleep_s
        return self.pick(busy_accounts=busy_accounts) if found else None

    def deferred(self) -> bool:
        """Candidates wait only for a contention delay (not idle: the key frees soon)."""
        now = time.monotonic()
        return any(self.contended_until.get(c.account_id, 0.0) > now for c in self.queue)

    def refresh(self, busy_payouts: AbstractSet[str] = frozenset()) -> None:
        """Fill the queue from P1: recovery first, then PENDING, spread over accounts."""
        try:
            # One page each (oldest first): enough to fill a short queue and see the backlog age.
            # A page of at least 4 × the queue's size (≤ P1's limit): spread over more accounts,
            # so processes working one backlog start on different accounts, not the same 100.
            page = min(LIST_MAX, max(LIST_PAGE, 4 * max(self.batch, 2 * self.concurrency)))
            pending = self.api.list_payouts("PENDING", limit=page, max_items=page)
            recover = [
                c
                for state in RECOVERABLE
                for c in self.api.list_payouts(state, max_items=LIST_PAGE)
            ]
        except DlockError as exc:
            self._note_outage(exc)
            if isinstance(exc, ServiceUnreachable) or exc.status in (503, 504):
                self._peer_failed(
                    "payments", "executor_list_failed", exc, {"ownerId": self.owner_id}
                )
            else:
                log_event(
                    "executor_list_failed",
                    level=logging.WARNING,
                    ownerId=self.owner_id,
                    error=str(exc),
                )
            return
        self.outages.recovered("payments")
        self.outage = False
        oldest = min((c.created_at for c in pending if c.created_at), default=None)
        payout_backlog_age.set(
            (datetime.now(UTC) - oldest).total_seconds() if oldest is not None else 0.0
        )
        self.round_progress = False
        skip = self.hands_off | set(busy_payouts) | {c.payout_id for c in self.queue}
        pending = [c for c in pending if c.payout_id not in skip]
        recover = [c for c in recover if c.payout_id not in skip]
        self.backed_off = {
            c.payout_id: c.account_id
            for c in recover + pending
            if self.backoff.blocked(c.account_id)
        }
        pending = [c for c in pending if not self.backoff.blocked(c.account_id)]
        recover = [c for c in recover if not self.backoff.blocked(c.account_id)]
        random.shuffle(pending)
        random.shuffle(recover)
        # A short queue, refreshed often: a long one goes stale while other executors work it.
        # Recovery first, but at most half of it: in-flight CLAIMED rows of live executors
        # show up here too (they are contended and skipped), and must not starve PENDING.
        batch = max(self.batch, 2 * self.concurrency)
        picked = recover[: max(1, batch // 2)]
        room = max(0, 2 * batch - len(self.queue))
        self.queue.extend(_spread((picked + pending)[: batch * 2])[: min(batch, room)])


def _spread(candidates: list[Candidate]) -> list[Candidate]:
    """Round-robin over accounts (order kept within each): N slots start on N accounts."""
    by_account: dict[str, deque[Candidate]] = {}
    for candidate in candidates:
        by_account.setdefault(candidate.account_id, deque()).append(candidate)
    spread: list[Candidate] = []
    while by_account:
        for account in list(by_account):
            spread.append(by_account[account].popleft())
            if not by_account[account]:
                del by_account[account]
    return spread
