"""The picker: step 1 of a section. A short queue refilled from P1, spread over accounts, with
the contention delays and the per-account back-off that decide what is eligible now.

Only the dispatcher thread calls `pick()`; `record()` is called from the section threads, each
with an outcome on an account the dispatcher keeps busy until it is recorded.
"""

from __future__ import annotations

import random
import time
from collections import deque
from collections.abc import Set as AbstractSet
from datetime import UTC, datetime

from dlock.budgets import BACKOFF_INITIAL_S
from dlock.client import DlockError, retry_delay_s
from dlock.metrics import payout_backlog_age
from executor.api import Api, Candidate
from executor.backoff import AccountBackoff, Pace
from executor.section import Outcome

RECOVERABLE = ("RAIL_ACKED", "CLAIMED")
LIST_PAGE = 100
LIST_MAX = 500  # P1's largest `limit`
# How often a queue whose candidates all wait (account in flight here, or contended) is re-listed.
REFILL_S = 0.25
# contended_until is pruned once it holds more than this many accounts (Picker.prune_contended).
CONTENDED_PRUNE_MIN = 1_024


class Picker:
    """The queue of candidates, and which accounts wait (contended, backed off, hands off)."""

    def __init__(
        self,
        api: Api,
        pace: Pace,
        *,
        owner_id: str,
        batch: int,
        concurrency: int,
        idle_sleep_s: float,
        backoff: AccountBackoff | None = None,
    ) -> None:
        self.api = api
        self.pace = pace
        self.owner_id = owner_id
        self.batch = batch
        self.concurrency = concurrency
        self.idle_sleep_s = idle_sleep_s
        self.backoff = backoff or AccountBackoff()
        self.queue: deque[Candidate] = deque()
        self.contended_until: dict[str, float] = {}  # accountId → monotonic time
        # contended_until is pruned of past delays whenever it outgrows this (then twice what
        # is left): bounded by twice the accounts contended at once, O(1) per record amortized.
        self.prune_at = CONTENDED_PRUNE_MIN
        # Payouts this process must not present again (DUPLICATE_SUBMISSION it could not resolve):
        # each retry would page someone, and nothing this executor can do resolves it.
        self.hands_off: set[str] = set()
        # payoutId → accountId the last listing skipped for back-off
        self.backed_off: dict[str, str] = {}
        self.next_refresh = 0.0
        self.next_refill = 0.0

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
        # idle until those sections end (the queue must feed N slots).
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
            self.pace.failed("payments", "executor_list_failed", exc, {"ownerId": self.owner_id})
            return
        self.pace.answered("payments")
        self.pace.outage = False
        oldest = min((c.created_at for c in pending if c.created_at), default=None)
        payout_backlog_age.set(
            (datetime.now(UTC) - oldest).total_seconds() if oldest is not None else 0.0
        )
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

    def record(self, outcome: Outcome) -> None:
        """What a section's outcome means for its account: a contention delay, a back-off
        step, or hands off the payout for good."""
        account_id, payout_id = outcome.fields["accountId"], outcome.fields["payoutId"]
        if outcome.contention is not None:
            # Another process holds the key: leave the account for a jittered retryAfterMillis.
            delay = retry_delay_s(outcome.contention, BACKOFF_INITIAL_S, cap_s=5.0)
            self.contended_until[account_id] = time.monotonic() + delay * (1.0 + random.random())
            if len(self.contended_until) > self.prune_at:
                self.prune_contended()
        if outcome.label == "duplicate":
            self.hands_off.add(payout_id)
        if outcome.refusal:
            self.backoff.note(account_id=account_id, payout_id=payout_id, outcome=outcome.label)

    def prune_contended(self) -> None:
        """Forget the contention delays that have run out (a past delay skips nothing)."""
        now = time.monotonic()
        self.contended_until = {a: t for a, t in self.contended_until.items() if t > now}
        self.prune_at = max(CONTENDED_PRUNE_MIN, 2 * len(self.contended_until))

    def only_stuck_left(self) -> bool:
        """The last listing skipped work, all of it on accounts backed off for good."""
        stuck = self.backoff.stuck()
        return bool(self.backed_off) and all(a in stuck for a in self.backed_off.values())

    def left_behind(self) -> dict[str, str]:
        """payoutId → why it was left (for the operator): what the last listing backed off."""
        stuck = self.backoff.stuck()
        return {pid: stuck.get(account, "backing off") for pid, account in self.backed_off.items()}


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
