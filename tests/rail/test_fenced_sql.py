"""railproxy.fenced_sql against real PostgreSQL: the strict high-water write and the revoke push."""

from __future__ import annotations

import json
import uuid

import pytest
from django.db import connections, transaction

from devstack.common import PROJECT
from dlock.dbrouter import alias_for
from dlock.prepared import prepared_cursor
from railproxy import fenced_sql

pytestmark = pytest.mark.django_db(databases=["default"])


def _cursor():
    return connections[alias_for("railproxy")].cursor()


def test_high_water_advances_only_strictly_upwards():
    account, payout = f"acct-{uuid.uuid4().hex[:8]}", uuid.uuid4()
    with transaction.atomic(), _cursor() as cursor:
        assert fenced_sql.advance_high_water(cursor, account_id=account, token=5, payout_id=payout)
        assert (
            fenced_sql.advance_high_water(cursor, account_id=account, token=5, payout_id=payout)
            is None
        )
        assert (
            fenced_sql.advance_high_water(cursor, account_id=account, token=4, payout_id=payout)
            is None
        )
        assert fenced_sql.advance_high_water(cursor, account_id=account, token=6, payout_id=payout)
        assert fenced_sql.high_water(cursor, account_id=account) == 6


def _mark(cursor, account: str) -> tuple | None:
    cursor.execute(
        "SELECT highest_token, retry_payout_id, updated_at FROM rail_high_water"
        " WHERE account_id = %s",
        [account],
    )
    return cursor.fetchone()


def test_the_first_admission_creates_the_mark_at_its_token_and_a_refusal_writes_nothing():
    """One upsert per admission (issue 18), on the server-binding prepared cursor the service
    uses: the first admission is the advance from 0; a fenced one leaves the row as it was."""
    account, payout = f"acct-{uuid.uuid4().hex[:8]}", uuid.uuid4()
    with transaction.atomic(), prepared_cursor(alias_for("railproxy")) as cursor:
        assert _mark(cursor, account) is None
        assert (
            fenced_sql.advance_high_water(cursor, account_id=account, token=7, payout_id=payout)
            == 7
        )
        assert _mark(cursor, account)[:2] == (7, None)
        fenced_sql.allow_same_token_retry(cursor, account_id=account, token=7, payout_id=payout)
        before = _mark(cursor, account)
        assert before[:2] == (7, payout)
        for token, presenter in ((6, payout), (7, uuid.uuid4())):
            assert (
                fenced_sql.advance_high_water(
                    cursor, account_id=account, token=token, payout_id=presenter
                )
                is None
            )
            assert _mark(cursor, account) == before  # not even updated_at moved
        assert (
            fenced_sql.advance_high_water(cursor, account_id=account, token=7, payout_id=payout)
            == 7
        )
        assert _mark(cursor, account)[:2] == (7, None)
        with pytest.raises(ValueError):
            fenced_sql.advance_high_water(cursor, account_id=account, token=0, payout_id=payout)


def test_equal_token_is_readmitted_only_for_the_payout_whose_attempt_was_not_sent():
    account, payout, other = f"acct-{uuid.uuid4().hex[:8]}", uuid.uuid4(), uuid.uuid4()
    with transaction.atomic(), _cursor() as cursor:
        fenced_sql.advance_high_water(cursor, account_id=account, token=9, payout_id=payout)
        assert fenced_sql.allow_same_token_retry(
            cursor, account_id=account, token=9, payout_id=payout
        )
        assert (
            fenced_sql.advance_high_water(cursor, account_id=account, token=9, payout_id=other)
            is None
        )
        assert fenced_sql.advance_high_water(cursor, account_id=account, token=9, payout_id=payout)
        # The allowance is single-use: the re-admission cleared it.
        assert (
            fenced_sql.advance_high_water(cursor, account_id=account, token=9, payout_id=payout)
            is None
        )
        # A newer token that touched the mark meanwhile forbids re-opening the old one.
        fenced_sql.advance_high_water(cursor, account_id=account, token=10, payout_id=other)
        assert not fenced_sql.allow_same_token_retry(
            cursor, account_id=account, token=9, payout_id=payout
        )


def test_raise_high_water_inserts_never_lowers_and_clears_the_retry_allowance():
    account, payout = f"acct-{uuid.uuid4().hex[:8]}", uuid.uuid4()
    with transaction.atomic(), _cursor() as cursor:
        assert fenced_sql.raise_high_water(cursor, account_id=account, floor=20) == 20
        assert fenced_sql.raise_high_water(cursor, account_id=account, floor=3) == 20
        fenced_sql.allow_same_token_retry(cursor, account_id=account, token=20, payout_id=payout)
        assert fenced_sql.raise_high_water(cursor, account_id=account, floor=21) == 21
        assert (
            fenced_sql.advance_high_water(cursor, account_id=account, token=21, payout_id=payout)
            is None
        )
        assert fenced_sql.advance_high_water(cursor, account_id=account, token=22, payout_id=payout)


def test_sweeper_thread_starts_only_in_the_rail_proxy_server_process(settings):
    from railproxy import sweep

    assert not sweep.serving_http()  # pytest, like any management command, serves no HTTP
    settings.ROLE = "railproxy"
    assert sweep.maybe_start() is False


def _pending_intents(cursor, ages: list[str]) -> list[tuple[uuid.UUID, uuid.UUID]]:
    """A funded account, and per age a SUBMITTING payout (token 4) whose PENDING intent was
    submitted that long ago (an SQL interval); (payout_id, submission_id) for each."""
    account = f"acct-{uuid.uuid4().hex[:8]}"
    cursor.execute(
        "INSERT INTO account (account_id, currency, kind, balance_minor, fence)"
        " VALUES (%s, 'EUR', 'CUSTOMER', 100, 0)",
        [account],
    )
    made = []
    for age in ages:
        payout_id, submission_id = uuid.uuid4(), uuid.uuid4()
        cursor.execute(
            "INSERT INTO payout (payout_id, account_id, amount_minor, currency,"
            " beneficiary_ref, state, attempt_count, claim_token, idempotency_key)"
            " VALUES (%s, %s, 10, 'EUR', 'b', 'SUBMITTING', 1, 4, %s)",
            [str(payout_id), account, f"payout-{payout_id}"],
        )
        cursor.execute(
            "INSERT INTO rail_submission (submission_id, payout_id, account_id, amount_minor,"
            " currency, presented_token, owner_id, idempotency_key, request_hash, client_ref,"
            " outcome, submitted_at) VALUES (%s, %s, %s, 10, 'EUR', 4, 'w', 'k', 'h', %s,"
            " 'PENDING', clock_timestamp() - %s::interval)",
            [str(submission_id), str(payout_id), account, str(payout_id), age],
        )
        made.append((payout_id, submission_id))
    return made


def test_sweep_quarantines_an_old_intent_once_and_leaves_a_fresh_one():
    from railproxy.sweep import sweep_unresolved_intents

    with _cursor() as cursor:
        (old, _), (fresh, _) = _pending_intents(cursor, ["1 hour", "0 seconds"])

    assert sweep_unresolved_intents(older_than_s=60) == 1
    assert sweep_unresolved_intents(older_than_s=60) == 0

    def state(payout_id):
        with _cursor() as cursor:
            cursor.execute(
                "SELECT s.outcome, s.detail, p.state FROM rail_submission s"
                " JOIN payout p USING (payout_id) WHERE payout_id = %s",
                [str(payout_id)],
            )
            return cursor.fetchone()

    assert state(old) == ("TIMEOUT", "sweep", "RAIL_AMBIGUOUS")
    assert state(fresh) == ("PENDING", None, "SUBMITTING")


def test_a_stamped_answer_is_stored_with_the_rows_own_times_as_the_wire_writes_them():
    """The 200 and its record in one UPDATE (issue 18): the stored text carries submitted_at and
    resolved_at exactly as rfc3339_ms writes the returned pair (UTC, ms truncated, "Z")."""
    from dlock.timefmt import rfc3339_ms

    with transaction.atomic(), prepared_cursor(alias_for("railproxy")) as cursor:
        # many sub-millisecond remainders: truncation, never rounding
        ages = [f"{137 * n} microseconds" for n in range(40)]
        for _, submission_id in _pending_intents(cursor, ages):
            body = {"submissionId": str(submission_id), "outcome": "ACKED", "note": 'q"\\é'}
            body.update(submittedAt=None, resolvedAt=None)
            resolved = fenced_sql.resolve_submission(
                cursor,
                submission_id=submission_id,
                outcome="ACKED",
                detail=None,
                rail_reference="rr",
                response_status=200,
                response_body=body,
                stamped=True,
            )
            body.update(submittedAt=rfc3339_ms(resolved[0]), resolvedAt=rfc3339_ms(resolved[1]))
            cursor.execute(
                "SELECT response_body, resolved_at FROM rail_submission WHERE submission_id = %s",
                [str(submission_id)],
            )
            stored, resolved_at = cursor.fetchone()
            assert stored == json.dumps(body, separators=(",", ":"))
            assert resolved_at == resolved[1]
        # A resolved intent takes no second outcome, stamped or not.
        assert (
            fenced_sql.resolve_submission(
                cursor,
                submission_id=submission_id,
                outcome="TIMEOUT",
                detail="sweep",
                rail_reference=None,
                response_status=502,
                response_body=body,
                stamped=True,
            )
            is None
        )
        with pytest.raises(ValueError):
            fenced_sql.resolve_submission(
                cursor,
                submission_id=submission_id,
                outcome="ACKED",
                detail=None,
                rail_reference=None,
                response_status=200,
                response_body={"resolvedAt": None, "submittedAt": None},
                stamped=True,
            )


def test_an_outcome_arriving_after_the_sweep_answers_the_sweeps_record_and_moves_nothing():
    from dlock.errors import ApiError
    from railproxy.models import Outcome
    from railproxy.recording import record
    from railproxy.submission import Admitted, RailAnswer, SubmissionRequest

    account, payout_id, submission_id = f"acct-{uuid.uuid4().hex[:8]}", uuid.uuid4(), uuid.uuid4()
    swept = {"code": "RAIL_AMBIGUOUS", "message": "swept", "details": {"reason": "sweep"}}
    with _cursor() as cursor:
        cursor.execute(
            "INSERT INTO account (account_id, currency, kind, balance_minor, fence)"
            " VALUES (%s, 'EUR', 'CUSTOMER', 100, 0)",
            [account],
        )
        cursor.execute(
            "INSERT INTO payout (payout_id, account_id, amount_minor, currency,"
            " beneficiary_ref, state, attempt_count, claim_token, idempotency_key)"
            " VALUES (%s, %s, 10, 'EUR', 'b', 'RAIL_AMBIGUOUS', 1, 4, %s)",
            [str(payout_id), account, f"payout-{payout_id}"],
        )
        cursor.execute(
            "INSERT INTO rail_submission (submission_id, payout_id, account_id, amount_minor,"
            " currency, presented_token, owner_id, idempotency_key, request_hash, client_ref,"
            " outcome, detail, submitted_at, resolved_at, response_status, response_body)"
            " VALUES (%s, %s, %s, 10, 'EUR', 4, 'w', 'k', 'h', %s, 'TIMEOUT', 'sweep',"
            " clock_timestamp(), clock_timestamp(), 409, %s)",
            [str(submission_id), str(payout_id), account, str(payout_id), json.dumps(swept)],
        )
    request = SubmissionRequest(payout_id, account, 10, "EUR", "b", 4, "w", "k")
    admitted = Admitted(submission_id, None)

    with pytest.raises(ApiError) as refused:
        record(request, admitted, RailAnswer(Outcome.ACKED, "acked", "rr-late"))

    assert refused.value.status == 409 and refused.value.code.value == "RAIL_AMBIGUOUS"
    assert refused.value.details == {"reason": "sweep"}
    with _cursor() as cursor:
        cursor.execute(
            "SELECT s.outcome, s.rail_reference, s.response_body, p.state FROM rail_submission s"
            " JOIN payout p USING (payout_id) WHERE s.submission_id = %s",
            [str(submission_id)],
        )
        assert cursor.fetchone() == ("TIMEOUT", None, json.dumps(swept), "RAIL_AMBIGUOUS")


def test_admission_recording_and_the_sweep_go_through_the_kits_gate_only():
    """One side-effect gate in the tree: rail-proxy's steps 1-3 and every outcome it records
    are the fence kit's SideEffectGate (admit / record) on the proxy's tables, never its own
    sequence of the mark's and the intent log's statements."""
    orchestration = {
        "admission.py": "RAIL_GATE.admit(",
        "recording.py": "RAIL_GATE.record(",
        "sweep.py": "RAIL_GATE.record(",
    }
    own_steps = (
        "advance_high_water",
        "high_water(",
        "live_submission",
        "allow_same_token_retry",
        "RAIL_MARK",
        "RAIL_INTENTS",
        "fenced_out(",
    )
    for name, gate_call in orchestration.items():
        source = (PROJECT / "railproxy" / name).read_text()
        assert gate_call in source, name
        assert [step for step in own_steps if step in source] == [], name
    assert fenced_sql.RAIL_GATE.mark is fenced_sql.RAIL_MARK
    assert fenced_sql.RAIL_GATE.intents is fenced_sql.RAIL_INTENTS
