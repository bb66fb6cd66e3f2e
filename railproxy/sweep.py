"""The sweep: intents nobody recorded an outcome for become TIMEOUT, their payouts RAIL_AMBIGUOUS.

`sweep_unresolved_intents()` is one sweep (also `manage.py rail_sweep`); the sweeper thread
runs it in a rail-proxy server process only, at start-up and every RAIL_SWEEP_INTERVAL_MS. Any
number of processes may sweep at once: rows are taken FOR UPDATE SKIP LOCKED and quarantined by
the side-effect gate's conditional record, so each intent is quarantined exactly once.
"""

from __future__ import annotations

import logging
import sys
import threading
from functools import partial

from django.conf import settings
from django.db import connections, transaction

from dlock import metrics
from dlock.errors import ApiError, Code
from dlock.fence.gate import Intent
from dlock.fence.marks import AMBIGUOUS
from dlock.logs import log_event
from payments.fenced_sql.payout import transition_payout
from railproxy import fenced_sql
from railproxy.models import Outcome
from railproxy.submission import alias, stored_error

SWEEP_OWNER = "rail-proxy:sweep"

_started = threading.Event()
_stop = threading.Event()


def serving_http() -> bool:
    """True in a gunicorn worker or `runserver`; False in every other management command.

    gunicorn's arbiter module is loaded only by a running gunicorn (importing its worker classes,
    as dlock.serving does, does not load it)."""
    return "gunicorn.arbiter" in sys.modules or (len(sys.argv) > 1 and sys.argv[1] == "runserver")


def maybe_start() -> bool:
    if settings.ROLE != "railproxy" or not settings.RAIL_SWEEP_ENABLED or not serving_http():
        return False
    if _started.is_set():
        return False
    _started.set()
    thread = threading.Thread(target=_loop, name="rail-intent-sweeper", daemon=True)
    thread.start()
    return True


def sweep_once() -> int:
    try:
        swept = sweep_unresolved_intents()
        if swept:
            log_event("rail_sweep", swept=swept)
        return swept
    except Exception as exc:  # the database may be down; the next round tries again
        log_event("rail_sweep_failed", level=logging.WARNING, error=type(exc).__name__)
        return 0
    finally:
        connections.close_all()  # hand the thread's connection back to the pool


def _loop() -> None:
    interval = settings.RAIL_SWEEP_INTERVAL_MS / 1000
    log_event("rail_sweeper_started", intervalMs=settings.RAIL_SWEEP_INTERVAL_MS)
    while not _stop.is_set():
        sweep_once()
        _stop.wait(interval)


def sweep_unresolved_intents(*, older_than_s: float | None = None) -> int:
    """Every intent PENDING for longer than its forwarder can still record it → TIMEOUT and its
    payout → RAIL_AMBIGUOUS. Never re-forwarded, by anyone, under any token. Returns the count.

    The forwarder may record up to rail connect + read + the recording's retry
    (RAIL_RECORD_RETRY_MS, while paydb cannot be reached) after admission; the sweep waits that
    long plus its margin, so it never quarantines an answer the recorder is still writing.
    """
    if older_than_s is None:
        older_than_s = (
            settings.RAIL_CONNECT_TIMEOUT_MS
            + settings.RAIL_READ_TIMEOUT_MS
            + settings.RAIL_RECORD_RETRY_MS
            + settings.RAIL_SWEEP_MARGIN_MS
        ) / 1000
    swept = 0
    with transaction.atomic(using=alias()), connections[alias()].cursor() as cursor:
        for submission_id, payout_id, account_id, token, owner_id in fenced_sql.stale_intents(
            cursor, older_than_s=older_than_s
        ):
            error = ApiError(
                Code.RAIL_AMBIGUOUS,
                "the attempt was forwarded (or about to be) and its outcome was never recorded; "
                "the payout is quarantined (RAIL_AMBIGUOUS), never resubmit",
                details={
                    "submissionId": str(submission_id),
                    "payoutId": str(payout_id),
                    "outcome": "TIMEOUT",
                    "reason": "sweep",
                },
            )
            resolve = partial(  # the gate's AMBIGUOUS quarantine, on the row's own resolve
                fenced_sql.resolve_submission,
                submission_id=submission_id,
                outcome=Outcome.TIMEOUT,
                detail="sweep",
                rail_reference=None,
                response_status=error.status,
                response_body=stored_error(error),
            )
            intent = Intent(submission_id, str(payout_id), account_id, token)
            if not fenced_sql.RAIL_GATE.record(cursor, intent, outcome=AMBIGUOUS, resolve=resolve):
                continue
            transition_payout(
                cursor,
                payout_id=payout_id,
                from_states=("SUBMITTING",),
                to_state="RAIL_AMBIGUOUS",
                token=None,
                owner_id=SWEEP_OWNER,
                note=f"intent {submission_id} unresolved for over {older_than_s:.1f}s",
            )
            swept += 1
            metrics.rail_submission.labels(outcome="timeout").inc()
            log_event(
                "rail_ambiguous",
                level=logging.WARNING,
                submissionId=str(submission_id),
                payoutId=str(payout_id),
                accountId=account_id,
                presentedToken=token,
                ownerId=owner_id,
                outcome="TIMEOUT",
                reason="sweep",
            )
    return swept
