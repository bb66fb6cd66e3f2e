"""The payout executor: pays each payout at most once, under any pause, crash or slow rail.

`Executor` composes three objects, one file each:

  picker       `executor/picking.py`   step 1: the queue from P1, contention delays, back-off
  section      `executor/section.py`   steps 2–7 of one payout under one grant → its outcome
  dispatcher   `executor/dispatch.py`  N sections in flight, idle, drain, the exit code

and owns what joins them: `run_one_payout(candidate)`, the one entry the dispatcher calls for
one payout (a fresh trace id, the section, then its outcome counted, logged and told to the
picker).
"""

from __future__ import annotations

import logging
import threading

from dlock.client import LockClient, RetryPolicy
from dlock.logs import log_event
from dlock.metrics import payout_execute
from dlock.tracing import new_trace_id, reset_trace_id, set_trace_id
from executor.api import Api, Candidate
from executor.backoff import AccountBackoff, Pace
from executor.dispatch import Dispatcher
from executor.pause import PausePlan
from executor.picking import Picker
from executor.section import Outcome, Section

__all__ = ["Executor"]


class Executor:
    """One worker process: one lock session, up to `concurrency` sections in flight (one per
    account). `run_one_payout()` is thread-safe for distinct accounts; `run()` is one loop per
    instance."""

    def __init__(
        self,
        *,
        owner_id: str,
        lock_url: str,
        payments_url: str,
        rail_proxy_url: str,
        lock_ttl_ms: int = 10_000,
        session_ttl_ms: int = 10_000,
        idle_sleep_s: float = 0.5,
        batch: int = 10,
        pause: PausePlan | None = None,
        acquire_retry: RetryPolicy | None = None,
        backoff: AccountBackoff | None = None,
        concurrency: int = 1,
        drain_budget_s: float = 20.0,
    ) -> None:
        self.owner_id = owner_id
        self.lock_ttl_ms = lock_ttl_ms
        self.concurrency = concurrency
        self.stop_requested = threading.Event()
        # One keep-alive connection per section thread, plus the heartbeat's and the picker's.
        pool_size = concurrency + 2
        self.api = Api(
            payments_url=payments_url,
            rail_proxy_url=rail_proxy_url,
            owner_id=owner_id,
            pool_size=pool_size,
        )
        self.pace = Pace()
        self.picker = Picker(
            self.api,
            self.pace,
            owner_id=owner_id,
            batch=batch,
            concurrency=concurrency,
            idle_sleep_s=idle_sleep_s,
            backoff=backoff,
        )
        self.section = Section(
            LockClient(lock_url, owner_id, default_ttl_ms=lock_ttl_ms, pool_size=pool_size),
            self.api,
            self.pace,
            owner_id=owner_id,
            lock_ttl_ms=lock_ttl_ms,
            session_ttl_ms=session_ttl_ms,
            pause=pause or PausePlan(None),
            # Another executor on the same account is working; move on rather than queue.
            acquire_retry=acquire_retry or RetryPolicy(max_retries=1),
            stop_requested=self.stop_requested,
        )
        self.dispatcher = Dispatcher(
            self.picker,
            self.pace,
            self.run_one_payout,
            self.stop_requested,
            concurrency=concurrency,
            drain_budget_s=drain_budget_s,
            idle_sleep_s=idle_sleep_s,
            owner_id=owner_id,
        )
        self.outcomes: dict[str, int] = {}
        self._mutex = threading.Lock()  # outcomes

    def request_stop(self, *_: object) -> None:
        """Signal handler: stop taking payouts; the current sections finish or abandon."""
        if not self.stop_requested.is_set():
            log_event("executor_stopping", ownerId=self.owner_id)
        self.stop_requested.set()

    def run(
        self,
        *,
        max_payouts: int | None = None,
        until_idle: bool = False,
        idle_timeout_s: float = 30.0,
    ) -> int:
        """The dispatcher's loop (see `Dispatcher.run`), then the session closed; returns the
        exit code: 0, or EXIT_BACKED_OFF when only backed-off work was left."""
        log_event(
            "executor_started",
            ownerId=self.owner_id,
            lockTtlMs=self.lock_ttl_ms,
            concurrency=self.concurrency,
        )
        try:
            code = self.dispatcher.run(
                max_payouts=max_payouts, until_idle=until_idle, idle_timeout_s=idle_timeout_s
            )
        finally:
            self.close()
        log_event(
            "executor_stopped",
            level=logging.ERROR if code else logging.INFO,
            ownerId=self.owner_id,
            sections=self.dispatcher.sections,
            outcomes=self.outcomes,
            exitCode=code,
            # what an operator must look at: payouts left behind, and why
            backedOff=self.picker.left_behind() if code else {},
        )
        return code

    def close(self) -> None:
        self.section.close()

    def run_one_payout(self, candidate: Candidate) -> Outcome:
        """One payout: its critical section under a fresh trace id, then its outcome counted
        (`payout_execute_total`), logged (`payout_executed`) and told to the picker."""
        trace = set_trace_id(new_trace_id())
        try:
            outcome = self.section.run(candidate)
            if outcome.counted:
                payout_execute.labels(outcome=outcome.label).inc()
            with self._mutex:
                self.outcomes[outcome.label] = self.outcomes.get(outcome.label, 0) + 1
            log_event("payout_executed", outcome=outcome.label, **outcome.fields)
            self.picker.record(outcome)
        finally:
            reset_trace_id(trace)
        return outcome
