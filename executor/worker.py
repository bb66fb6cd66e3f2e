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
from typing import Any

from dlock.budgets import BACKOFF_INITIAL_S, BUDGETS
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
    NotLeader,
    Overloaded,
    PayoutNotClaimable,
    RailAmbiguous,
    RailUnavailable,
    RetryPolicy,
    ServiceUnreachable,
    SessionExpired,
    SessionUnknown,
    ValidationFailed,
    retry_delay_s,
)
from dlock.logs import log_event
from dlock.metrics import payout_execute
from dlock.tracing import new_trace_id, reset_trace_id, set_trace_id
from executor.api import Api, Candidate
from executor.backoff import AccountBackoff, PeerOutages
from executor.dispatch import Dispatcher
from executor.pause import PausePlan
from executor.picking import LIST_PAGE, RECOVERABLE, Picker  # noqa: F401 - re-exported

# Outcomes after which the payout is exactly where it was: waiting on someone else.
NO_PROGRESS = ("lock_contended", "lock_lost", "error", "abandoned", "skipped")
# Not executions, so not counted in payout_execute_total (logged as payout_executed).
UNCOUNTED = ("abandoned", "skipped")
CLAIMABLE = ("PENDING", "CLAIMED")
# The service each hop calls (for outage episodes).
HOP_PEERS = {"claim": "payments", "post": "payments", "submit": "railproxy"}
# `--until-idle` with only backed-off work left: the run did not finish its work (issue 19.2).
EXIT_BACKED_OFF = 3


class Abandon(Exception):
    """Stop requested mid-section before anything irreversible: release and leave."""


class Executor(Picker):
    """One worker process: one lock session, up to `concurrency` sections in flight (one per
    account). `execute()` is thread-safe for distinct accounts; `run()` is one loop per instance."""

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
        self.session_ttl_ms = session_ttl_ms
        self.idle_sleep_s = idle_sleep_s
        self.batch = batch
        # One keep-alive connection per section thread, plus the heartbeat's and the picker's.
        pool_size = concurrency + 2
        self.locks = LockClient(lock_url, owner_id, default_ttl_ms=lock_ttl_ms, pool_size=pool_size)
        self.api = Api(
            payments_url=payments_url,
            rail_proxy_url=rail_proxy_url,
            owner_id=owner_id,
            pool_size=pool_size,
        )
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
        # A dependency (lock server, payment resource) did not answer the last call: the run
        # is waiting out an outage, not idle (issue 16: --until-idle must not give up on it).
        self.outage = False
        # key → the highest fencing token this process has presented to a resource under it.
        # A grant whose token is not above it (a re-acquire after a release that timed out
        # hands the same grant back) is never used for another payout: a false FENCED_OUT.
        self.presented: dict[str, int] = {}
        self.backoff = backoff or AccountBackoff()
        # Services that stopped answering: one WARNING per episode, jittered back-off between
        # new sections while it lasts (issue 27.2).
        self.outages = PeerOutages()
        self.concurrency = concurrency
        self.drain_budget_s = drain_budget_s
        self._mutex = threading.Lock()  # the session, counters and outcomes
        self.contended_until: dict[str, float] = {}  # accountId → monotonic time
        self.slow_until = 0.0  # a 503/429 asked the whole process to slow down until then
        self.next_refresh = 0.0
        self.next_refill = 0.0
        self.exit_code = 0
        self.EXIT_BACKED_OFF = EXIT_BACKED_OFF
        # payoutId → accountId the last listing skipped for back-off
        self.backed_off: dict[str, str] = {}

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

        Up to `concurrency` sections run at once, on distinct accounts (`executor.dispatch`).
        until_idle also gives up after `idle_timeout_s` without progress (e.g. a payout stuck
        CLAIMED behind an unavailable rail), so a batch run always ends. Time spent in an outage
        (a dependency not answering) counts as neither idleness nor lack of progress: the run
        waits it out instead of exiting with work left. Returns the exit code: 0, or
        EXIT_BACKED_OFF when only backed-off work was left.
        """
        log_event(
            "executor_started",
            ownerId=self.owner_id,
            lockTtlMs=self.lock_ttl_ms,
            concurrency=self.concurrency,
        )
        dispatcher = Dispatcher(
            self, concurrency=self.concurrency, drain_budget_s=self.drain_budget_s
        )
        try:
            code = dispatcher.run(
                max_payouts=max_payouts, until_idle=until_idle, idle_timeout_s=idle_timeout_s
            )
        finally:
            self.close()
        stuck = self.backoff.stuck()
        log_event(
            "executor_stopped",
            level=logging.ERROR if code else logging.INFO,
            ownerId=self.owner_id,
            sections=self.sections,
            outcomes=self.outcomes,
            exitCode=code,
            # what an operator must look at: payouts left behind, and why
            backedOff={
                pid: stuck.get(account, "backing off") for pid, account in self.backed_off.items()
            }
            if code
            else {},
        )
        return code

    def close(self) -> None:
        with self._mutex:
            if self.session is not None:
                self.session.close()
                self.session = None

    def run_one_payout(self) -> bool:
        """One critical section on the next candidate. False when there was nothing to try."""
        candidate = self.pick()
        if candidate is None:
            return False
        trace = set_trace_id(new_trace_id())
        try:
            self.execute(candidate)
        finally:
            reset_trace_id(trace)
        return True

    # -- steps 2–7: one critical section -------------------------------------------------

    def _session(self) -> LockSession:
        """The process's one lock session (one heartbeat), reopened once it was lost."""
        with self._mutex:
            if self.session is not None and self.session.lost is None:
                return self.session
            if self.session is not None:
                self.session.close()
            self.session = self.locks.open_session(self.session_ttl_ms)
            return self.session

    def execute(self, candidate: Candidate) -> str:
        """Run one payout's critical section; returns the outcome label it counted."""
        key = f"payout:{candidate.account_id}"
        fields: dict[str, Any] = {
            "payoutId": candidate.payout_id,
            "accountId": candidate.account_id,
            "ownerId": self.owner_id,
        }
        try:
            grant = self._fresh_grant(key)
        except (LockContended, ContentionExceeded) as exc:
            self._contended(candidate.account_id, exc)
            return self._skip("lock_contended", fields)
        except (SessionUnknown, SessionExpired) as exc:
            log_event("executor_session_lost", level=logging.WARNING, error=str(exc), **fields)
            return self._skip("lock_lost", fields)
        except DlockError as exc:
            self._note_outage(exc)
            if unreachable(exc):  # once per outage episode, then a counter and a back-off
                self._peer_failed("lockserver", "executor_lock_failed", exc, fields)
            else:
                log_event("executor_lock_failed", level=logging.WARNING, error=str(exc), **fields)
            # an outage is waited out by the loop, not held against the account
            return self._count("error", fields, refusal=not self.outage)
        self.outages.recovered("lockserver")
        if grant is None:
            log_event("executor_token_reused", level=logging.WARNING, key=key, **fields)
            return self._skip("lock_lost", fields)
        self.outage = False
        with self._mutex:
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
            self._slow_down(exc)
            if unreachable(exc):
                self._peer_failed(exc.peer or "payments", "executor_error", exc, fields)
            else:
                log_event(
                    "executor_error", level=logging.WARNING, code=exc.code, error=str(exc), **fields
                )
        finally:
            grant.release()
        return self._count(outcome, fields)

    def _fresh_grant(self, key: str) -> Grant | None:
        """A grant on `key` whose token this process has never presented, or None.

        A release that timed out leaves the grant held by this session, and the server hands
        the same grant (same token) back to the next acquire: presenting it for another payout
        would be refused by the fence as stale (a false FENCED_OUT, issue 16.3). Such a grant is
        released for real and acquired once more; a second reused token gives up on the key.
        """
        for _ in range(2):
            grant = self._session().acquire(key, self.lock_ttl_ms, 0, retry=self.acquire_retry)
            if grant.token > self.presented.get(key, 0):
                return grant
            log_event(
                "executor_grant_reacquired",
                key=key,
                token=grant.token,
                presented=self.presented[key],
                ownerId=self.owner_id,
            )
            grant.release()
        return None

    def _present(self, grant: Grant) -> None:
        """Record that `grant.token` is about to reach a resource (before each protected write)."""
        self.presented[grant.key] = max(grant.token, self.presented.get(grant.key, 0))

    def _note_outage(self, exc: DlockError) -> None:
        """A dependency that did not answer, or answered 503, is an outage to wait out."""
        if isinstance(exc, (ServiceUnreachable, NotLeader, Overloaded)):
            self.outage = True
        self._slow_down(exc)

    def _peer_failed(self, peer: str, event: str, exc: DlockError, fields: dict[str, Any]) -> None:
        """`peer` did not answer: back off the whole process (jittered, bounded, growing while
        the episode lasts); `event` is logged once per episode, every attempt is counted."""
        delay = self.outages.failed(peer, event, code=exc.code, error=str(exc), **fields)
        self.slow_until = max(self.slow_until, time.monotonic() + delay)
        self.outage = True  # waited out, never mistaken for idleness (--until-idle)

    def _slow_down(self, exc: DlockError) -> None:
        """A 503/429 from any service slows the whole process: no new section until then."""
        if exc.status not in (429, 503):
            return
        delay = retry_delay_s(exc, BACKOFF_INITIAL_S * 2, cap_s=5.0) * (0.5 + random.random())
        self.slow_until = max(self.slow_until, time.monotonic() + delay)

    def _contended(self, account_id: str, exc: DlockError) -> None:
        """Another process holds the key: leave the account for a jittered retryAfterMillis."""
        delay = retry_delay_s(exc, BACKOFF_INITIAL_S, cap_s=5.0) * (1.0 + random.random())
        self.contended_until[account_id] = time.monotonic() + delay
        self._slow_down(exc)  # CONTENTION_EXCEEDED is a 429

    def _checkpoint(self, grant: Grant, phase: str, fields: dict[str, Any]) -> None:
        """Between steps: honour a stop request, re-check the grant, then the pause hook."""
        if self.stop_requested.is_set():
            raise Abandon
        grant.ensure_valid()
        self.pause.at(phase, wait=self.stop_requested.wait, **fields)
        if self.stop_requested.is_set() and phase != "before_post":
            raise Abandon  # post is finished even when stopping: RAIL_ACKED is money moved

    def _section(self, grant: Grant, candidate: Candidate, fields: dict[str, Any]) -> str:
        """Claim what the listing says is claimable straight away: P2's answer carries what the
        submission needs, so the payout is read (P4) only when the listing was stale (P2 said
        PAYOUT_NOT_CLAIMABLE) or the payout is RAIL_ACKED (its submissions are needed)."""
        if candidate.state in CLAIMABLE:
            fields["state"] = candidate.state
            try:
                claimed = self._claim(grant, candidate.payout_id, candidate.state, fields)
            except PayoutNotClaimable:
                # The listing was stale (another executor moved it): act on where it is now.
                return self._by_state(
                    grant, candidate, self.api.get_payout(candidate.payout_id), fields
                )
            if claimed is None:
                return "failed"
            payout = {
                "payoutId": candidate.payout_id,
                "accountId": candidate.account_id,
                "amountMinor": candidate.amount_minor,
                "currency": candidate.currency,
                "beneficiaryRef": claimed.get("beneficiaryRef"),
            }
            if payout["beneficiaryRef"] is None:  # a replay recorded before P2 carried it
                payout = self.api.get_payout(candidate.payout_id)
            return self._submit_and_post(grant, candidate, payout, fields)
        return self._by_state(grant, candidate, self.api.get_payout(candidate.payout_id), fields)

    def _by_state(
        self, grant: Grant, candidate: Candidate, payout: dict[str, Any], fields: dict[str, Any]
    ) -> str:
        """The section from the payout as read now (P4): claim, recover a RAIL_ACKED, or skip."""
        state = payout["state"]
        fields["state"] = state
        if state in CLAIMABLE:
            if self._claim(grant, candidate.payout_id, state, fields) is None:
                return "failed"
            return self._submit_and_post(grant, candidate, payout, fields)
        if state == "RAIL_ACKED":
            submission = _acked_submission(payout)
            if submission is None:
                log_event("executor_no_acked_submission", level=logging.ERROR, **fields)
                return "error"
            return self._post(grant, candidate, submission, fields)
        # The listing was stale (another executor finished it): not an execution.
        return "skipped"

    def _claim(
        self, grant: Grant, payout_id: str, state: str, fields: dict[str, Any]
    ) -> dict[str, Any] | None:
        """P2 under this grant; its answer, or None when the payout FAILED for funds."""
        self._checkpoint(grant, "before_claim", fields)
        self._present(grant)
        try:
            claimed = self.api.claim(
                payout_id, token=grant.token, proof=grant.proof, expected_state=state
            )
        except InsufficientFunds:
            fields["state"] = "FAILED"  # P2 failed it for funds
            return None
        fields["state"] = str(claimed.get("state") or "CLAIMED")
        self._hop("claim", fields)
        return claimed

    def _submit_and_post(
        self, grant: Grant, candidate: Candidate, payout: dict[str, Any], fields: dict[str, Any]
    ) -> str:
        self._checkpoint(grant, "before_submit", fields)
        submission = self._submit(grant, payout, fields)
        if isinstance(submission, str):
            return submission
        return self._post(grant, candidate, submission, fields)

    def _post(
        self,
        grant: Grant,
        candidate: Candidate,
        submission: dict[str, Any],
        fields: dict[str, Any],
    ) -> str:
        self._renew_if_short(grant, BUDGETS["payments.write"].read_s, fields)
        if not self.stop_requested.is_set():
            self._checkpoint(grant, "before_post", fields)
        else:
            grant.ensure_valid()
        self._present(grant)
        self.api.post(
            candidate.payout_id,
            token=grant.token,
            proof=grant.proof,
            rail_reference=str(submission["railReference"]),
            submission_id=str(submission["submissionId"]),
        )
        fields["state"] = "POSTED"
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

    def _submit(
        self, grant: Grant, payout: dict[str, Any], fields: dict[str, Any]
    ) -> dict[str, Any] | str:
        """Present the payout to the rail once. Returns the ACKED submission or an outcome."""
        self._present(grant)
        try:
            submission = self.api.submit(payout, token=grant.token, proof=grant.proof)
        except RailAmbiguous as exc:
            fields["state"] = "RAIL_AMBIGUOUS"  # the proxy quarantined it
            self._ambiguous(fields, exc.details)
            return "ambiguous"
        except ServiceUnreachable as exc:
            if exc.sent:
                # Our read gave up after sending (or the proxy's proxy did: UPSTREAM_TIMEOUT):
                # the proxy recorded the truth; we must not guess, and never re-send.
                fields["state"] = self._state_now(str(payout["payoutId"]))
                reason = {
                    "UPSTREAM_TIMEOUT": "upstream timeout",
                    "UPSTREAM_FAILED": "upstream failed",
                }.get(str(exc.code), "read timeout")
                self._ambiguous(fields, {"reason": f"executor {reason}"})
                return "ambiguous"
            return "error"  # nothing reached the proxy; payout stays CLAIMED for recovery
        except RailUnavailable as exc:
            fields["state"] = "CLAIMED"  # nothing presented; back to CLAIMED for a later grant
            self._slow_down(exc)
            return "error"
        except ValidationFailed as exc:
            fields["state"] = str((exc.details or {}).get("payoutState") or "FAILED")
            log_event("executor_rail_rejected", details=exc.details, **fields)
            return "failed"
        except DuplicateSubmission:
            return self._resolve_duplicate(str(payout["payoutId"]), fields)
        fields["state"] = "RAIL_ACKED"
        self._hop("submit", fields, railReference=submission.get("railReference"))
        return submission

    def _resolve_duplicate(self, payout_id: str, fields: dict[str, Any]) -> dict[str, Any] | str:
        """DUPLICATE_SUBMISSION: read the existing record; post it if ACKED, else stop."""
        payout = self.api.get_payout(payout_id)
        fields["state"] = payout["state"]
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

    def _state_now(self, payout_id: str) -> str:
        """The payout's state as P4 says now (advisory: for the event only), or UNKNOWN."""
        try:
            return str(self.api.get_payout(payout_id)["state"])
        except (DlockError, KeyError, TypeError):
            return "UNKNOWN"

    # -- bookkeeping ---------------------------------------------------------------------

    def _ambiguous(self, fields: dict[str, Any], details: dict[str, Any] | None) -> None:
        log_event("rail_ambiguous", level=logging.WARNING, details=details or {}, **fields)

    def _hop(self, hop: str, fields: dict[str, Any], **extra: Any) -> None:
        self.outages.recovered(HOP_PEERS[hop])
        log_event("executor_hop", hop=hop, **fields, **extra)

    def _skip(self, outcome: str, fields: dict[str, Any]) -> str:
        return self._count(outcome, fields)

    def _count(self, outcome: str, fields: dict[str, Any], *, refusal: bool = True) -> str:
        if outcome not in NO_PROGRESS:
            self.progressed = self.round_progress = True
        if outcome not in UNCOUNTED:
            payout_execute.labels(outcome=outcome).inc()
        with self._mutex:
            self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
        log_event("payout_executed", outcome=outcome, **fields)
        if refusal:
            self.backoff.note(
                account_id=fields["accountId"], payout_id=fields["payoutId"], outcome=outcome
            )
        return outcome


def unreachable(exc: DlockError) -> bool:
    """The service did not answer (refused, timed out, dropped) or said 503/504: an outage."""
    return isinstance(exc, ServiceUnreachable) or exc.status in (503, 504)


def _acked_submission(payout: dict[str, Any]) -> dict[str, Any] | None:
    for submission in payout.get("submissions") or []:
        if submission.get("outcome") == "ACKED" and submission.get("railReference"):
            return submission
    return None
