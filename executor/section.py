"""One payout's critical section (steps 2–7) under one grant, returning its outcome.

  2. lock      acquire `payout:{accountId}` → a fresh fencing token t
  3. read      P4 only when needed (advisory: picks the step to resume at, never decides safety)
  4. claim     P2 with t, expectedState PENDING, or CLAIMED to recover a dead claimer's payout
  5. submit    rail proxy with t — presented once, never retried
  6. post      P3 with t (also how the next holder finishes a RAIL_ACKED payout)
  7. release   best effort; expiry is the fallback

The stop flag is checked between steps and `grant.ensure_valid()` runs before every protected
write. Outcomes (C3 §3.2/§3.7): FENCED_OUT aborts the section (no retry, no
re-acquire-and-continue); RAIL_AMBIGUOUS emits `rail_ambiguous` and stops on that payout;
INSUFFICIENT_FUNDS or a rail decline end FAILED; DUPLICATE_SUBMISSION is resolved from P4.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
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
from executor.api import Api, Candidate
from executor.backoff import Pace
from executor.pause import PausePlan

# Outcomes after which the payout is exactly where it was: waiting on someone else.
NO_PROGRESS = ("lock_contended", "lock_lost", "error", "abandoned", "skipped")
# Not executions, so not counted in payout_execute_total (logged as payout_executed).
UNCOUNTED = ("abandoned", "skipped")
CLAIMABLE = ("PENDING", "CLAIMED")
# The service each hop calls (for outage episodes).
HOP_PEERS = {"claim": "payments", "post": "payments", "submit": "railproxy"}


@dataclass
class Outcome:
    """How one section ended: its label (`payout_execute_total{outcome}`) and log fields."""

    label: str
    fields: dict[str, Any]
    held: bool = False  # a grant was taken: a section ran (counts towards --max-payouts)
    refusal: bool = True  # held against the account (back-off); not while an outage lasts
    contention: DlockError | None = None  # another process holds the key: its retryAfter
    progressed: bool = field(init=False)  # the payout moved (not waiting on someone else)
    counted: bool = field(init=False)  # an execution: in payout_execute_total

    def __post_init__(self) -> None:
        self.progressed = self.label not in NO_PROGRESS
        self.counted = self.label not in UNCOUNTED


class Abandon(Exception):
    """Stop requested mid-section before anything irreversible: release and leave."""


class Section:
    """Runs one payout's section at a time per thread; one instance serves every slot of the
    process (the per-payout state lives in the call), over one lock session (one heartbeat)."""

    def __init__(
        self,
        locks: LockClient,
        api: Api,
        pace: Pace,
        *,
        owner_id: str,
        lock_ttl_ms: int,
        session_ttl_ms: int,
        pause: PausePlan,
        acquire_retry: RetryPolicy,
        stop_requested: threading.Event,
    ) -> None:
        self.locks = locks
        self.api = api
        self.pace = pace
        self.owner_id = owner_id
        self.lock_ttl_ms = lock_ttl_ms
        self.session_ttl_ms = session_ttl_ms
        self.pause = pause
        self.acquire_retry = acquire_retry
        self.stop_requested = stop_requested
        self.session: LockSession | None = None
        self._mutex = threading.Lock()  # the session

    def run(self, candidate: Candidate) -> Outcome:
        """Steps 2–7 for `candidate`: lock, claim, submit, post, release."""
        key = f"payout:{candidate.account_id}"
        fields: dict[str, Any] = {
            "payoutId": candidate.payout_id,
            "accountId": candidate.account_id,
            "ownerId": self.owner_id,
        }
        try:
            grant = self._session().acquire(key, self.lock_ttl_ms, 0, retry=self.acquire_retry)
        except (LockContended, ContentionExceeded) as exc:
            self.pace.slow_down(exc)  # CONTENTION_EXCEEDED is a 429
            return Outcome("lock_contended", fields, contention=exc)
        except (SessionUnknown, SessionExpired) as exc:
            log_event("executor_session_lost", level=logging.WARNING, error=str(exc), **fields)
            return Outcome("lock_lost", fields)
        except DlockError as exc:
            self.pace.failed("lockserver", "executor_lock_failed", exc, fields)
            # an outage is waited out by the loop, not held against the account
            return Outcome("error", fields, refusal=not self.pace.outage)
        self.pace.answered("lockserver")
        self.pace.outage = False
        fields["token"] = grant.token
        log_event("executor_section_started", key=key, state=candidate.state, **fields)
        try:
            label = self._steps(grant, candidate, fields)
        except Abandon:
            label = "abandoned"
            log_event("executor_section_abandoned", **fields)
        except FencedOut as exc:
            # Incident-grade: a newer holder exists. Abort the whole section, never retry.
            label = "fenced_out"
            log_event(
                "executor_fenced_out",
                level=logging.ERROR,
                code=exc.code,
                details=exc.details,
                **fields,
            )
        except LockLost as exc:
            label = "lock_lost"
            log_event("executor_lock_lost", level=logging.WARNING, details=exc.details, **fields)
        except PayoutNotClaimable as exc:
            label = "not_claimable"
            log_event("executor_not_claimable", details=exc.details, **fields)
        except DlockError as exc:
            label = "error"
            self.pace.failed(exc.peer or "payments", "executor_error", exc, fields)
        finally:
            grant.release()
        return Outcome(label, fields, held=True)

    def close(self) -> None:
        with self._mutex:
            if self.session is not None:
                self.session.close()
                self.session = None

    def _session(self) -> LockSession:
        """The process's one lock session (one heartbeat), reopened once it was lost."""
        with self._mutex:
            if self.session is not None and self.session.lost is None:
                return self.session
            if self.session is not None:
                self.session.close()
            self.session = self.locks.open_session(self.session_ttl_ms)
            return self.session

    def _checkpoint(self, grant: Grant, phase: str, fields: dict[str, Any]) -> None:
        """Between steps: honour a stop request, re-check the grant, then the pause hook."""
        if self.stop_requested.is_set():
            raise Abandon
        grant.ensure_valid()
        self.pause.at(phase, wait=self.stop_requested.wait, **fields)
        if self.stop_requested.is_set() and phase != "before_post":
            raise Abandon  # post is finished even when stopping: RAIL_ACKED is money moved

    def _steps(self, grant: Grant, candidate: Candidate, fields: dict[str, Any]) -> str:
        """Claim what the listing says is claimable straight away: P2's answer carries what the
        submission needs, so the payout is read (P4) only when the listing was stale (P2 said
        PAYOUT_NOT_CLAIMABLE) or the payout is RAIL_ACKED (its submissions are needed)."""
        if candidate.state not in CLAIMABLE:
            return self._by_state(grant, candidate, fields)
        fields["state"] = candidate.state
        try:
            claimed = self._claim(grant, candidate.payout_id, candidate.state, fields)
        except PayoutNotClaimable:
            # The listing was stale (another executor moved it): act on where it is now.
            return self._by_state(grant, candidate, fields)
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

    def _by_state(self, grant: Grant, candidate: Candidate, fields: dict[str, Any]) -> str:
        """The section from the payout as read now (P4): claim, recover a RAIL_ACKED, or skip."""
        payout = self.api.get_payout(candidate.payout_id)
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
        try:
            claimed = self.api.claim(payout_id, grant=grant, expected_state=state)
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
        # A slow rail can eat the lease: extend it (same token) if the post may outlast it.
        # Past the local deadline it is not renewed (ensure_valid raises LockLost first); the
        # payout then waits, RAIL_ACKED, for the next holder to post it.
        if 0.0 < grant.remaining() < BUDGETS["payments.write"].read_s:
            grant.renew()
            log_event("executor_renewed", remaining=round(grant.remaining(), 3), **fields)
        if not self.stop_requested.is_set():
            self._checkpoint(grant, "before_post", fields)
        else:
            grant.ensure_valid()
        self.api.post(
            candidate.payout_id,
            grant=grant,
            rail_reference=str(submission["railReference"]),
            submission_id=str(submission["submissionId"]),
        )
        fields["state"] = "POSTED"
        self._hop("post", fields)
        return "posted"

    def _submit(
        self, grant: Grant, payout: dict[str, Any], fields: dict[str, Any]
    ) -> dict[str, Any] | str:
        """Present the payout to the rail once. Returns the ACKED submission or an outcome."""
        try:
            submission = self.api.submit(payout, grant=grant)
        except RailAmbiguous as exc:
            fields["state"] = "RAIL_AMBIGUOUS"  # the proxy quarantined it
            log_event("rail_ambiguous", level=logging.WARNING, details=exc.details or {}, **fields)
            return "ambiguous"
        except ServiceUnreachable as exc:
            if not exc.sent:
                return "error"  # nothing reached the proxy; payout stays CLAIMED for recovery
            # Our read gave up after sending (or the proxy's proxy did: UPSTREAM_TIMEOUT):
            # the proxy recorded the truth; we must not guess, and never re-send.
            fields["state"] = self._state_now(str(payout["payoutId"]))
            reason = {
                "UPSTREAM_TIMEOUT": "upstream timeout",
                "UPSTREAM_FAILED": "upstream failed",
            }.get(str(exc.code), "read timeout")
            details = {"reason": f"executor {reason}"}
            log_event("rail_ambiguous", level=logging.WARNING, details=details, **fields)
            return "ambiguous"
        except RailUnavailable as exc:
            fields["state"] = "CLAIMED"  # nothing presented; back to CLAIMED for a later grant
            self.pace.slow_down(exc)
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
        """DUPLICATE_SUBMISSION: read the existing record; post it if ACKED, else stop (the
        picker then leaves the payout alone: nothing this process can do resolves it)."""
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
        return "duplicate" if acked is None else acked

    def _state_now(self, payout_id: str) -> str:
        """The payout's state as P4 says now (advisory: for the event only), or UNKNOWN."""
        try:
            return str(self.api.get_payout(payout_id)["state"])
        except (DlockError, KeyError, TypeError):
            return "UNKNOWN"

    def _hop(self, hop: str, fields: dict[str, Any], **extra: Any) -> None:
        self.pace.answered(HOP_PEERS[hop])
        log_event("executor_hop", hop=hop, **fields, **extra)


def _acked_submission(payout: dict[str, Any]) -> dict[str, Any] | None:
    for submission in payout.get("submissions") or []:
        if submission.get("outcome") == "ACKED" and submission.get("railReference"):
            return submission
    return None
