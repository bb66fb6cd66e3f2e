"""The payout executor: pays each payout at most once, under any pause, crash or slow rail.

One grant per payout. `run_one_payout()` is one critical section, built from these steps, with
the stop flag checked between them and `grant.ensure_valid()` before every protected write:

  1. pick      next candidate from P1 (RAIL_ACKED and CLAIMED recovery first, then PENDING)
  2. lock      acquire `payout:{accountId}` → fresh fencing token t
  3. read      P4 (advisory: picks the step to resume at, never decides safety)
  4. claim     P2 with t, expectedState PENDING, or CLAIMED to recover a dead claimer's payout
  5. submit    rail proxy with t — presented once, never retried
  6. post      P3 with t (also how the next holder finishes a RAIL_ACKED payout)
  7. release   best effort; expiry is the fallback

Outcomes (C3 §3.2/§3.7): FENCED_OUT aborts the section (no retry, no re-acquire-and-continue);
RAIL_AMBIGUOUS emits `rail_ambiguous`, counts outcome=ambiguous and stops on that payout;
INSUFFICIENT_FUNDS or a rail decline end FAILED; DUPLICATE_SUBMISSION is resolved from P4.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from datetime import UTC, datetime
from typing import Any

from dlock.budgets import BUDGETS
from dlock.client import (
    ContentionExceeded,
    DlockError,
    DuplicateSubmission,
    FencedOut,
    Grant,
    InsufficientFunds,
    LockClient,
    LockContended,
    LockLost,
    LockSession,
    PayoutNotClaimable,
    RailAmbiguous,
    RailUnavailable,
    RetryPolicy,
    ServiceUnreachable,
    SessionExpired,
    SessionUnknown,
    ValidationFailed,
)
from dlock.logs import log_event
from dlock.metrics import payout_backlog_age, payout_execute
from dlock.tracing import new_trace_id, reset_trace_id, set_trace_id
from executor.api import Api, Candidate
from executor.pause import PausePlan

RECOVERABLE = ("RAIL_ACKED", "CLAIMED")
LIST_PAGE = 100
# Outcomes after which the payout is exactly where it was: waiting on someone else.
NO_PROGRESS = ("lock_contended", "lock_lost", "error", "abandoned", "skipped")
# Not executions, so not counted in payout_execute_total (logged as payout_executed).
UNCOUNTED = ("abandoned", "skipped")
CLAIMABLE = ("PENDING", "CLAIMED")


class Abandon(Exception):  # noqa: N818 - a control-flow signal, not an error
    """Stop requested mid-section before anything irreversible: release and leave."""


class Executor:
    """One worker process's loop. Thread-compatible, not thread-safe: one loop per instance."""

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
    ) -> None:
        self.owner_id = owner_id
        self.lock_ttl_ms = lock_ttl_ms
        self.session_ttl_ms = session_ttl_ms
        self.idle_sleep_s = idle_sleep_s
        self.batch = batch
        self.locks = LockClient(lock_url, owner_id, default_ttl_ms=lock_ttl_ms)
        self.api = Api(payments_url=payments_url, rail_proxy_url=rail_proxy_url, owner_id=owner_id)
        self.pause = pause or PausePlan(None)
        # Another executor on the same account is working; move on rather than queue (≤ C3's 5).
        self.acquire_retry = acquire_retry or RetryPolicy(max_retries=1)
        self.stop_requested = threading.Event()
        self.session: LockSession | None = None
        self.queue: deque[Candidate] = deque()
        self.outcomes: dict[str, int] = {}
        self.sections = 0
        # Payouts this process must not present again (DUPLICATE_SUBMISSION it could not resolve):
        # each retry would page someone, and nothing this executor can do resolves it.
        self.hands_off: set[str] = set()
        self.progressed = False  # since the loop last looked
        self.round_progress = False  # since the last P1 refresh

    # -- loop ----------------------------------------------------------------------------

    def request_stop(self, *_: object) -> None:
        """Signal handler: stop taking payouts; the current section finishes or abandons."""
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
        """Loop until stopped, `max_payouts` sections ran, or (until_idle) nothing is left.

        until_idle also gives up after `idle_timeout_s` without progress (e.g. a payout stuck
        CLAIMED behind an unavailable rail), so a batch run always ends.
        """
        log_event("executor_started", ownerId=self.owner_id, lockTtlMs=self.lock_ttl_ms)
        last_progress = time.monotonic()
        try:
            while not self.stop_requested.is_set():
                if max_payouts is not None and self.sections >= max_payouts:
                    break
                worked = self.run_one_payout()
                if self.progressed:
                    last_progress = time.monotonic()
                    self.progressed = False
                if worked and self.queue:
                    continue
                if until_idle and (not worked or time.monotonic() - last_progress > idle_timeout_s):
                    break
                if not worked or not self.round_progress:
                    # Nothing to do, or a round of only contention: don't spin on the lock server.
                    self.stop_requested.wait(self.idle_sleep_s)
        finally:
            self.close()
        log_event(
            "executor_stopped",
            ownerId=self.owner_id,
            sections=self.sections,
            outcomes=self.outcomes,
        )
        return 0

    def close(self) -> None:
        if self.session is not None:
            self.session.close()
            self.session = None

    def run_one_payout(self) -> bool:
        """One critical section on the next candidate. False when there was nothing to try."""
        candidate = self.next_candidate()
        if candidate is None:
            return False
        trace = set_trace_id(new_trace_id())
        try:
            self.execute(candidate)
        finally:
            reset_trace_id(trace)
        return True

    # -- step 1: pick --------------------------------------------------------------------

    def next_candidate(self) -> Candidate | None:
        if not self.queue:
            self.refresh()
        return self.queue.popleft() if self.queue else None

    def refresh(self) -> None:
        """Fill the queue from P1: recovery first, then PENDING, each shuffled."""
        try:
            # One page each (oldest first): enough to fill a short queue and see the backlog age.
            pending = self.api.list_payouts("PENDING", max_items=LIST_PAGE)
            recover = [
                c
                for state in RECOVERABLE
                for c in self.api.list_payouts(state, max_items=LIST_PAGE)
            ]
        except DlockError as exc:
            log_event(
                "executor_list_failed", level=logging.WARNING, ownerId=self.owner_id, error=str(exc)
            )
            return
        oldest = min((c.created_at for c in pending if c.created_at), default=None)
        payout_backlog_age.set(
            (datetime.now(UTC) - oldest).total_seconds() if oldest is not None else 0.0
        )
        self.round_progress = False
        pending = [c for c in pending if c.payout_id not in self.hands_off]
        recover = [c for c in recover if c.payout_id not in self.hands_off]
        random.shuffle(pending)
        random.shuffle(recover)
        # A short queue, refreshed often: a long one goes stale while other executors work it.
        # Recovery first, but at most half of it: in-flight CLAIMED rows of live executors
        # show up here too (they are contended and skipped), and must not starve PENDING.
        picked = recover[: max(1, self.batch // 2)]
        self.queue.extend((picked + pending)[: self.batch])

    # -- steps 2–7: one critical section -------------------------------------------------

    def _session(self) -> LockSession:
        if self.session is not None and self.session.lost is None:
            return self.session
        if self.session is not None:
            self.session.close()
        self.session = self.locks.open_session(self.session_ttl_ms)
        return self.session

    def execute(self, candidate: Candidate) -> str:
        """Run one payout's critical section; returns the outcome label it counted."""
        key = f"payout:{candidate.account_id}"
        fields: dict[str, Any] = {"payoutId": candidate.payout_id, "ownerId": self.owner_id}
        try:
            session = self._session()
            grant = session.acquire(key, self.lock_ttl_ms, 0, retry=self.acquire_retry)
        except (LockContended, ContentionExceeded):
            return self._skip("lock_contended", fields)
        except (SessionUnknown, SessionExpired) as exc:
            log_event("executor_session_lost", level=logging.WARNING, error=str(exc), **fields)
            return self._skip("lock_lost", fields)
        except DlockError as exc:
            log_event("executor_lock_failed", level=logging.WARNING, error=str(exc), **fields)
            return self._skip("error", fields)
        self.sections += 1
        fields["token"] = grant.token
        log_event("executor_section_started", key=key, state=candidate.state, **fields)
        try:
            outcome = self._section(grant, candidate, fields)
        except Abandon:
            outcome = "abandoned"
            log_event("executor_section_abandoned", **fields)
        except FencedOut as exc:
            # Incident-grade: a newer holder exists. Abort the whole section, never retry.
            outcome = "fenced_out"
            log_event(
                "executor_fenced_out",
                level=logging.ERROR,
                code=exc.code,
                details=exc.details,
                **fields,
            )
        except LockLost as exc:
            outcome = "lock_lost"
            log_event("executor_lock_lost", level=logging.WARNING, details=exc.details, **fields)
        except PayoutNotClaimable as exc:
            outcome = "not_claimable"
            log_event("executor_not_claimable", details=exc.details, **fields)
        except DlockError as exc:
            outcome = "error"
            log_event(
                "executor_error", level=logging.WARNING, code=exc.code, error=str(exc), **fields
            )
        finally:
            grant.release()
        return self._count(outcome, fields)

    def _checkpoint(self, grant: Grant, phase: str, fields: dict[str, Any]) -> None:
        """Between steps: honour a stop request, re-check the grant, then the pause hook."""
        if self.stop_requested.is_set():
            raise Abandon
        grant.ensure_valid()
        self.pause.at(phase, wait=self.stop_requested.wait, **fields)
        if self.stop_requested.is_set() and phase != "before_post":
            raise Abandon  # post is finished even when stopping: RAIL_ACKED is money moved

    def _section(self, grant: Grant, candidate: Candidate, fields: dict[str, Any]) -> str:
        payout = self.api.get_payout(candidate.payout_id)
        state = payout["state"]
        fields["state"] = state
        if state in CLAIMABLE:
            self._checkpoint(grant, "before_claim", fields)
            try:
                self.api.claim(
                    candidate.payout_id, token=grant.token, proof=grant.proof, expected_state=state
                )
            except InsufficientFunds:
                return "failed"
            self._hop("claim", fields)
            self._checkpoint(grant, "before_submit", fields)
            submission = self._submit(grant, payout, fields)
            if isinstance(submission, str):
                return submission
        elif state == "RAIL_ACKED":
            submission = _acked_submission(payout)
            if submission is None:
                log_event("executor_no_acked_submission", level=logging.ERROR, **fields)
                return "error"
        else:
            # The listing was stale (another executor finished it): not an execution.
            return "skipped"
        self._renew_if_short(grant, BUDGETS["payments.write"].read_s, fields)
        if not self.stop_requested.is_set():
            self._checkpoint(grant, "before_post", fields)
        else:
            grant.ensure_valid()
        self.api.post(
            candidate.payout_id,
            token=grant.token,
            proof=grant.proof,
            rail_reference=str(submission["railReference"]),
            submission_id=str(submission["submissionId"]),
        )
        self._hop("post", fields)
        return "posted"

    def _renew_if_short(self, grant: Grant, needed_s: float, fields: dict[str, Any]) -> None:
        """A slow rail can eat the lease: extend it (same token) if the next hop may outlast it.

        Past the local deadline the grant is not renewed (ensure_valid raises LockLost first);
        the payout then waits, RAIL_ACKED, for the next holder to post it.
        """
        if 0.0 < grant.remaining() < needed_s:
            grant.renew()
            log_event("executor_renewed", remaining=round(grant.remaining(), 3), **fields)

    def _submit(self, grant: Grant, payout: dict[str, Any], fields: dict[str, Any]):
        """Present the payout to the rail once. Returns the ACKED submission or an outcome."""
        try:
            submission = self.api.submit(payout, token=grant.token, proof=grant.proof)
        except RailAmbiguous as exc:
            self._ambiguous(fields, exc.details)
            return "ambiguous"
        except ServiceUnreachable as exc:
            if exc.sent:
                # Our read gave up after sending: the proxy recorded the truth; we must not guess.
                self._ambiguous(fields, {"reason": "executor read timeout"})
                return "ambiguous"
            return "error"  # nothing reached the proxy; payout stays CLAIMED for recovery
        except RailUnavailable:
            return "error"  # nothing presented; payout back to CLAIMED, a later grant retries
        except ValidationFailed as exc:
            log_event("executor_rail_rejected", details=exc.details, **fields)
            return "failed"
        except DuplicateSubmission:
            return self._resolve_duplicate(str(payout["payoutId"]), fields)
        self._hop("submit", fields, railReference=submission.get("railReference"))
        return submission

    def _resolve_duplicate(self, payout_id: str, fields: dict[str, Any]):
        """DUPLICATE_SUBMISSION: read the existing record; post it if ACKED, else stop."""
        payout = self.api.get_payout(payout_id)
        acked = _acked_submission(payout) if payout["state"] == "RAIL_ACKED" else None
        log_event(
            "executor_duplicate_resolved",
            level=logging.WARNING,
            payoutState=payout["state"],
            acked=acked is not None,
            **fields,
        )
        if acked is None:
            self.hands_off.add(payout_id)
            return "duplicate"
        return acked

    # -- bookkeeping ---------------------------------------------------------------------

    def _ambiguous(self, fields: dict[str, Any], details: dict[str, Any] | None) -> None:
        log_event("rail_ambiguous", level=logging.WARNING, details=details or {}, **fields)

    def _hop(self, hop: str, fields: dict[str, Any], **extra: Any) -> None:
        log_event("executor_hop", hop=hop, **fields, **extra)

    def _skip(self, outcome: str, fields: dict[str, Any]) -> str:
        return self._count(outcome, fields)

    def _count(self, outcome: str, fields: dict[str, Any]) -> str:
        if outcome not in NO_PROGRESS:
            self.progressed = self.round_progress = True
        if outcome not in UNCOUNTED:
            payout_execute.labels(outcome=outcome).inc()
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
        log_event("payout_executed", outcome=outcome, **fields)
        return outcome


def _acked_submission(payout: dict[str, Any]) -> dict[str, Any] | None:
    for submission in payout.get("submissions") or []:
        if submission.get("outcome") == "ACKED" and submission.get("railReference"):
            return submission
    return None
