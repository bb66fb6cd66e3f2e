"""Up to N critical sections in flight in one executor process (issue 17).

One dispatcher (the main thread) picks candidates and hands each to a worker thread, which runs
exactly the serial section (`Executor.execute`: fresh grant, `ensure_valid()` before every
protected write, FENCED_OUT aborts that section only). The dispatcher never lets two sections of
one account run at once, never dispatches while a 503/429 asked the process to slow down, and
on a stop request picks nothing more, drains within the drain budget and returns.

Threads, not asyncio or processes: every hop is a blocking HTTP call that releases the GIL, the
client library is synchronous and thread-safe, and one process keeps one lock session (one
heartbeat) for all its sections. The threads share one keep-alive connection pool per service
replica (`dlock.http.ConnectionPool`, urllib3) sized to N + 2, so no section reconnects per hop.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import TYPE_CHECKING

from dlock.logs import log_event
from dlock.metrics import executor_inflight, payout_execute_seconds
from dlock.tracing import new_trace_id, reset_trace_id, set_trace_id

if TYPE_CHECKING:
    from executor.api import Candidate
    from executor.worker import Executor

TICK_S = 0.05


class Dispatcher:
    """Feeds N slots from the executor's queue; returns the run's exit code."""

    def __init__(self, executor: Executor, *, concurrency: int, drain_budget_s: float) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.ex = executor
        self.n = concurrency
        self.drain_budget_s = drain_budget_s
        self.inflight: dict[Future[str], Candidate] = {}
        # Set when a section ends: waiting on it, not on every in-flight future (wait() installs
        # and removes a waiter on each of the N futures per wake-up).
        self._finished = threading.Event()

    def run(self, *, max_payouts: int | None, until_idle: bool, idle_timeout_s: float) -> int:
        ex = self.ex
        last_progress = time.monotonic()
        pool = ThreadPoolExecutor(self.n, thread_name_prefix="payout")
        try:
            while not ex.stop_requested.is_set():
                self._reap()
                if ex.progressed or ex.outage:
                    last_progress = time.monotonic()
                    ex.progressed = False
                if max_payouts is not None and ex.sections >= max_payouts and not self.inflight:
                    return 0
                dispatched = self._fill(pool, max_payouts)
                if self.inflight:
                    # A section's end sets it; one cleared after waking is seen by _reap next.
                    self._finished.wait(TICK_S)
                    self._finished.clear()
                    continue
                if dispatched or ex.deferred() or time.monotonic() < ex.slow_until:
                    # contended keys, or a 503/429/outage back-off: their delay runs out soon,
                    # and waiting it out is not idleness
                    ex.stop_requested.wait(TICK_S)
                    continue
                if until_idle:
                    code = self._idle_exit(last_progress, idle_timeout_s)
                    if code is not None:
                        return code
                ex.stop_requested.wait(ex.idle_sleep_s)
            return 0
        finally:
            self._drain(pool)

    def _fill(self, pool: ThreadPoolExecutor, max_payouts: int | None) -> int:
        """Start sections until N are in flight, the queue has nothing eligible, or slowed."""
        ex = self.ex
        started = 0
        while len(self.inflight) < self.n and not ex.stop_requested.is_set():
            if max_payouts is not None and ex.sections + len(self.inflight) >= max_payouts:
                break
            if time.monotonic() < ex.slow_until:
                break
            if ex.outage and self.inflight:
                break  # a peer is not answering: one section at a time probes it, not N
            busy = {c.account_id for c in self.inflight.values()}
            candidate = ex.pick(busy_accounts=busy, busy_payouts=self._busy_payouts())
            if candidate is None:
                break
            future = pool.submit(self._section, candidate)
            self.inflight[future] = candidate
            future.add_done_callback(self._on_finished)
            started += 1
        return started

    def _on_finished(self, _future: Future[str]) -> None:
        self._finished.set()

    def _busy_payouts(self) -> set[str]:
        return {c.payout_id for c in self.inflight.values()}

    def _section(self, candidate: Candidate) -> str:
        started = time.monotonic()
        executor_inflight.inc()
        trace = set_trace_id(new_trace_id())
        outcome = "error"
        try:
            outcome = self.ex.execute(candidate)
        except Exception:  # a bug in one section must not take the process down
            logging.getLogger(__name__).exception("section crashed")
        finally:
            reset_trace_id(trace)
            executor_inflight.dec()
            payout_execute_seconds.labels(outcome=outcome).observe(time.monotonic() - started)
        return outcome

    def _reap(self) -> None:
        for future in [f for f in self.inflight if f.done()]:
            del self.inflight[future]

    def _idle_exit(self, last_progress: float, idle_timeout_s: float) -> int | None:
        """With --until-idle and nothing in flight: the exit code, or None to keep going."""
        ex = self.ex
        if ex.backed_off:
            stuck = ex.backoff.stuck()
            if all(account in stuck for account in ex.backed_off.values()):
                ex.exit_code = ex.EXIT_BACKED_OFF
                return ex.exit_code
        idle = not ex.outage and not ex.backed_off
        if idle or time.monotonic() - last_progress > idle_timeout_s:
            ex.exit_code = ex.EXIT_BACKED_OFF if ex.backed_off else 0
            return ex.exit_code
        return None

    def _drain(self, pool: ThreadPoolExecutor) -> None:
        """Stop picking; let in-flight sections finish or abandon within the drain budget."""
        if self.inflight:
            log_event(
                "executor_draining",
                ownerId=self.ex.owner_id,
                inflight=len(self.inflight),
                budgetS=self.drain_budget_s,
            )
            _, late = wait(list(self.inflight), timeout=self.drain_budget_s)
            if late:
                # Closing the session marks their grants lost: no protected write after this.
                log_event(
                    "executor_drain_late",
                    level=logging.WARNING,
                    ownerId=self.ex.owner_id,
                    inflight=len(late),
                )
        pool.shutdown(wait=False, cancel_futures=True)
