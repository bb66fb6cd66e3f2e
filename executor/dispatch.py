"""The dispatcher: up to N critical sections in flight in one executor process, and the run's
exit code.

One dispatcher (the main thread) picks candidates and hands each to a worker thread, which runs
one payout (`Executor.run_one_payout`: a fresh grant, `ensure_valid()` before every protected
write, FENCED_OUT aborts that section only). The dispatcher never lets two sections of one
account run at once, never dispatches while a 503/429 asked the process to slow down, and on a
stop request picks nothing more, drains within the drain budget and returns.

Threads, not asyncio or processes: every hop is a blocking HTTP call that releases the GIL, the
client library is synchronous and thread-safe, and one process keeps one lock session (one
heartbeat) for all its sections. The threads share one keep-alive connection pool per service
replica (`dlock.http.ConnectionPool`, urllib3) sized to N + 2, so no section reconnects per hop.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait

from dlock.logs import log_event
from dlock.metrics import executor_inflight, payout_execute_seconds
from executor.api import Candidate
from executor.backoff import Pace
from executor.picking import Picker
from executor.section import Outcome

TICK_S = 0.05
# `--until-idle` with only backed-off work left: the run did not finish its work.
EXIT_BACKED_OFF = 3


class Dispatcher:
    """Feeds N slots from the picker; `run()` returns the run's exit code."""

    def __init__(
        self,
        picker: Picker,
        pace: Pace,
        run_one_payout: Callable[[Candidate], Outcome],
        stop_requested: threading.Event,
        *,
        concurrency: int,
        drain_budget_s: float,
        idle_sleep_s: float,
        owner_id: str,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.picker = picker
        self.pace = pace
        self.run_one_payout = run_one_payout
        self.stop_requested = stop_requested
        self.n = concurrency
        self.drain_budget_s = drain_budget_s
        self.idle_sleep_s = idle_sleep_s
        self.owner_id = owner_id
        self.inflight: dict[Future[Outcome], Candidate] = {}
        self.sections = 0  # sections that took a grant (--max-payouts counts these)
        self.progressed = False  # a section moved a payout since the loop last looked
        # Set when a section ends: waiting on it, not on every in-flight future (wait() installs
        # and removes a waiter on each of the N futures per wake-up).
        self._finished = threading.Event()
        self._mutex = threading.Lock()  # sections, progressed

    def run(self, *, max_payouts: int | None, until_idle: bool, idle_timeout_s: float) -> int:
        """Loop until stopped, `max_payouts` sections ran, or (until_idle) nothing is left.

        until_idle also gives up after `idle_timeout_s` without progress (e.g. a payout stuck
        CLAIMED behind an unavailable rail), so a batch run always ends. Time spent in an outage
        (a dependency not answering) counts as neither idleness nor lack of progress: the run
        waits it out instead of exiting with work left. Returns 0, or EXIT_BACKED_OFF when only
        backed-off work was left.
        """
        last_progress = time.monotonic()
        pool = ThreadPoolExecutor(self.n, thread_name_prefix="payout")
        try:
            while not self.stop_requested.is_set():
                self._reap()
                if self._progressed() or self.pace.outage:
                    last_progress = time.monotonic()
                if max_payouts is not None and self.sections >= max_payouts and not self.inflight:
                    return 0
                dispatched = self._fill(pool, max_payouts)
                if self.inflight:
                    # A section's end sets it; one cleared after waking is seen by _reap next.
                    self._finished.wait(TICK_S)
                    self._finished.clear()
                    continue
                if dispatched or self.picker.deferred() or self.pace.slowed():
                    # contended keys, or a 503/429/outage back-off: their delay runs out soon,
                    # and waiting it out is not idleness
                    self.stop_requested.wait(TICK_S)
                    continue
                if until_idle:
                    code = self._idle_exit(last_progress, idle_timeout_s)
                    if code is not None:
                        return code
                self.stop_requested.wait(self.idle_sleep_s)
            return 0
        finally:
            self._drain(pool)

    def _fill(self, pool: ThreadPoolExecutor, max_payouts: int | None) -> int:
        """Start sections until N are in flight, the queue has nothing eligible, or slowed."""
        started = 0
        while len(self.inflight) < self.n and not self.stop_requested.is_set():
            if max_payouts is not None and self.sections + len(self.inflight) >= max_payouts:
                break
            if self.pace.slowed():
                break
            if self.pace.outage and self.inflight:
                break  # a peer is not answering: one section at a time probes it, not N
            busy_accounts = {c.account_id for c in self.inflight.values()}
            busy_payouts = {c.payout_id for c in self.inflight.values()}
            candidate = self.picker.pick(busy_accounts=busy_accounts, busy_payouts=busy_payouts)
            if candidate is None:
                break
            future = pool.submit(self._slot, candidate)
            self.inflight[future] = candidate
            future.add_done_callback(self._on_finished)
            started += 1
        return started

    def _progressed(self) -> bool:
        """Whether a section moved a payout since the last look (and forget it)."""
        with self._mutex:
            progressed, self.progressed = self.progressed, False
            return progressed

    def _on_finished(self, _future: Future[Outcome]) -> None:
        self._finished.set()

    def _slot(self, candidate: Candidate) -> Outcome | None:
        """One worker thread's run of one payout, measured."""
        started = time.monotonic()
        executor_inflight.inc()
        outcome = None
        try:
            outcome = self.run_one_payout(candidate)
            with self._mutex:
                self.sections += outcome.held
                self.progressed = self.progressed or outcome.progressed
        except Exception:  # a bug in one section must not take the process down
            logging.getLogger(__name__).exception("section crashed")
        finally:
            executor_inflight.dec()
            label = outcome.label if outcome is not None else "error"
            payout_execute_seconds.labels(outcome=label).observe(time.monotonic() - started)
        return outcome

    def _reap(self) -> None:
        for future in [f for f in self.inflight if f.done()]:
            del self.inflight[future]

    def _idle_exit(self, last_progress: float, idle_timeout_s: float) -> int | None:
        """With --until-idle and nothing in flight: the exit code, or None to keep going."""
        if self.picker.only_stuck_left():
            return EXIT_BACKED_OFF
        backed_off = bool(self.picker.backed_off)
        idle = not self.pace.outage and not backed_off
        if idle or time.monotonic() - last_progress > idle_timeout_s:
            return EXIT_BACKED_OFF if backed_off else 0
        return None

    def _drain(self, pool: ThreadPoolExecutor) -> None:
        """Stop picking; let in-flight sections finish or abandon within the drain budget."""
        if self.inflight:
            log_event(
                "executor_draining",
                ownerId=self.owner_id,
                inflight=len(self.inflight),
                budgetS=self.drain_budget_s,
            )
            _, late = wait(list(self.inflight), timeout=self.drain_budget_s)
            if late:
                # Closing the session marks their grants lost: no protected write after this.
                log_event(
                    "executor_drain_late",
                    level=logging.WARNING,
                    ownerId=self.owner_id,
                    inflight=len(late),
                )
        pool.shutdown(wait=False, cancel_futures=True)
