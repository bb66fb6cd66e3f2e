"""Rail submission (C3 §3.5): admission, one forward, the outcome recorded.

Steps of `submit()`, each in a module of its own:
1. `railproxy.admission.admit` — identity lock + replay lookup, the payout named exactly (its own
   stable idempotency key included), strict high-water advance, no live submission, payout
   CLAIMED under this token → SUBMITTING + intent row PENDING; one transaction, COMMIT;
2. `railproxy.rail_call.forward` — present the payout to the rail once, never retried;
3. `railproxy.recording.record` — the outcome and the payout's move in one transaction.
A replayed identity is answered by `railproxy.recording.answer_replay`; intents nobody recorded
are quarantined by `railproxy.sweep.sweep_unresolved_intents`.
"""

from __future__ import annotations

from django.db import connections

from dlock.logs import log_event
from railproxy.admission import admit
from railproxy.rail_call import forward
from railproxy.recording import answer_replay, record
from railproxy.submission import Accepted, FencedRecorded, Replay, SubmissionRequest, alias


def submit(*, request: SubmissionRequest) -> Accepted:
    """The whole C3 §3.5 flow; returns the 200 body or raises the typed ApiError."""
    admission = admit(request)
    if isinstance(admission, Replay):
        return answer_replay(request, admission)
    if isinstance(admission, FencedRecorded):
        raise admission.error
    log_event(
        "rail_intent_committed",
        submissionId=str(admission.submission_id),
        payoutId=str(request.payout_id),
        presentedToken=request.token,
        ownerId=request.owner_id,
    )
    # The forward may take the whole read timeout: give the database connection back first.
    connections[alias()].close()
    answer = forward(request=request, submission_id=admission.submission_id)
    return record(request, admission, answer)
