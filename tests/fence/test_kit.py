"""The fence kit (dlock.fence) as an adopter uses it: proofs verified with public keys only, the
fenced write on the adopter's own table in real PostgreSQL, the side-effect gate, the Django
decorator. Rows are read back after every refusal."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import uuid

import psycopg
import pytest
from django.db import connection, transaction
from django.http import JsonResponse
from django.middleware.csrf import CsrfViewMiddleware
from django.test import RequestFactory, override_settings
from psycopg import sql

from devstack.common import PROJECT
from dlock.fence import (
    GATE_SCHEMA_SQL,
    Ambiguous,
    Declined,
    DuplicateOperation,
    FencedOut,
    HighWaterMark,
    Intent,
    IntentLog,
    InvalidToken,
    NotSent,
    PublicKeys,
    SideEffectGate,
    SigningKeys,
    Superseded,
    Verifier,
    fenced_update,
    verified_token,
)
from dlock.fence.django import fenced_view
from dlock.fence.proofs import new_signing_key
from tests.conftest import _create_db
from tests.payments.factories import fenced_count

LOCK_SERVER = SigningKeys.parse(f"{new_signing_key('k2')},{new_signing_key('k1')}")
PUBLIC = LOCK_SERVER.public()


@pytest.fixture(scope="module")
def adopter_db() -> str:
    url = _create_db(f"fence_kit_{uuid.uuid4().hex[:6]}")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE stock (sku text PRIMARY KEY, quantity integer NOT NULL,"
            " fence bigint NOT NULL DEFAULT 0, last_writer text)"
        )
        conn.execute(GATE_SCHEMA_SQL)
    return url


@pytest.fixture
def conn(adopter_db):
    with psycopg.connect(adopter_db, autocommit=True) as connection:
        yield connection


def _row(conn, sku: str) -> tuple:
    return conn.execute(
        "SELECT quantity, fence, last_writer FROM stock WHERE sku = %s", [sku]
    ).fetchone()


def _stock(conn, quantity: int = 10) -> str:
    sku = f"sku-{uuid.uuid4().hex[:8]}"
    conn.execute("INSERT INTO stock (sku, quantity) VALUES (%s, %s)", [sku, quantity])
    return sku


def _take(conn, sku: str, token: int, owner: str, *, same_grant: bool = False) -> tuple:
    with conn.transaction(), conn.cursor() as cursor:
        return fenced_update(
            cursor,
            table="stock",
            where={"sku": sku},
            set={"quantity": sql.SQL("quantity - 1"), "last_writer": owner},
            token=token,
            owner_id=owner,
            resource_type="stock",
            resource_id=sku,
            same_grant=same_grant,
            returning=("quantity",),
        )


# ------------------------------------------------------------------------------------- proofs


def test_the_kit_imports_without_django_settings():
    code = (
        "import dlock.fence as f; from django.conf import settings; "
        "assert not settings.configured; print(f.Verifier.__name__)"
    )
    env = {"PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=PROJECT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0 and done.stdout.strip() == "Verifier", done.stderr


def test_headers_in_token_out_and_every_bad_presentation_is_invalid_token():
    verifier = Verifier(PUBLIC)
    good = {"X-Fencing-Token": "7", "X-Fencing-Proof": LOCK_SERVER.sign(key="stock:a", token=7)}
    assert verified_token(good, key="stock:a", verifier=verifier) == 7

    cases = {
        "missing token": ({"X-Fencing-Proof": good["X-Fencing-Proof"]}, "missing"),
        "bad token": ({**good, "X-Fencing-Token": "7.0"}, "malformed"),
        "missing proof": ({"X-Fencing-Token": "7"}, "missing"),
        "truncated": ({**good, "X-Fencing-Proof": good["X-Fencing-Proof"][:-2]}, "malformed"),
        "other key": ({**good, "X-Fencing-Token": "8"}, "mismatch"),
        "lower token": ({**good, "X-Fencing-Token": "6"}, "mismatch"),
        "other kid": ({**good, "X-Fencing-Proof": "v2.zz." + "A" * 86}, "unknown_kid"),
    }
    for name, (headers, reason) in cases.items():
        with pytest.raises(InvalidToken) as refused:
            verified_token(headers, key="stock:a", verifier=verifier)
        assert refused.value.reason == reason, name
        assert refused.value.status == 400 and refused.value.code == "INVALID_TOKEN"
    with pytest.raises(InvalidToken):
        verified_token(good, key="stock:b", verifier=verifier)


def test_a_verifiers_public_keys_mint_nothing_another_verifier_accepts():
    public_value = PUBLIC.setting_value()
    mine, theirs = Verifier(PublicKeys.parse(public_value)), Verifier(PUBLIC)
    for kid, public_b64 in (entry.split(":") for entry in public_value.split(",")):
        minted = SigningKeys.parse(f"{kid}:{public_b64}").sign(key="stock:a", token=9)
        for verifier in (mine, theirs):
            with pytest.raises(InvalidToken):
                verifier.verify(minted, key="stock:a", token=9)


def test_a_rotation_reaches_a_verifier_that_refreshes_on_an_unknown_kid():
    old = SigningKeys.parse(new_signing_key("old"))
    newest = new_signing_key("new")
    server_keys = [old]
    calls = []
    now = [0.0]

    def refresh() -> PublicKeys:
        calls.append(now[0])
        return server_keys[0].public()

    verifier = Verifier(old.public(), refresh=refresh, min_refresh_s=30, clock=lambda: now[0])
    verifier.verify(old.sign(key="k", token=1), key="k", token=1)
    assert calls == []

    server_keys[0] = SigningKeys.parse(newest)  # the lock server now signs with `new`
    proof = server_keys[0].sign(key="k", token=2)
    verifier.verify(proof, key="k", token=2)
    assert calls == [0.0]
    with pytest.raises(InvalidToken) as refused:  # a kid nobody has: refreshed at most once
        verifier.verify("v2.nobody." + "A" * 86, key="k", token=3)
    assert refused.value.reason == "unknown_kid" and calls == [0.0]
    # The refreshed set lacks `old`: its proof, verified (and remembered) before, stops passing.
    with pytest.raises(InvalidToken) as retired:
        verifier.verify(old.sign(key="k", token=1), key="k", token=1)
    assert retired.value.reason == "unknown_kid"


def test_the_verifier_is_thread_safe_and_its_memory_is_bounded():
    verifier = Verifier(PUBLIC, cache_size=8)
    proofs = [(t, LOCK_SERVER.sign(key="stock:a", token=t)) for t in range(1, 41)]
    failures = []

    def check(offset: int) -> None:
        try:
            for token, proof in proofs[offset:] + proofs[:offset]:
                verifier.verify(proof, key="stock:a", token=token)
                with pytest.raises(InvalidToken):
                    verifier.verify(proof, key="stock:a", token=token + 100)
        except Exception as exc:
            failures.append(exc)

    threads = [threading.Thread(target=check, args=(i * 5,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    assert len(verifier._verified) <= 8


# ------------------------------------------------------------------------------ fenced write


def test_a_stale_token_is_fenced_out_and_the_row_is_unchanged(conn):
    sku = _stock(conn)
    before_count = fenced_count("stock")
    assert _take(conn, sku, 5, "worker-b") == (9,)

    with pytest.raises(FencedOut) as refused:
        _take(conn, sku, 4, "worker-a")

    assert _row(conn, sku) == (9, 5, "worker-b")
    fenced = refused.value
    assert fenced.status == 409 and fenced.retry_safe is False
    assert fenced.details == {
        "presentedToken": 4,
        "highestToken": 5,
        "resourceType": "stock",
        "resourceId": sku,
        "ownerId": "worker-a",
    }
    assert fenced_count("stock") == before_count + 1


def test_the_same_token_is_refused_strictly_and_admitted_as_the_same_grant(conn):
    sku = _stock(conn)
    _take(conn, sku, 5, "w")
    with pytest.raises(FencedOut):
        _take(conn, sku, 5, "w")
    assert _take(conn, sku, 5, "w", same_grant=True) == (8,)
    with pytest.raises(FencedOut):
        _take(conn, sku, 4, "w", same_grant=True)
    assert _row(conn, sku) == (8, 5, "w")


def test_an_unknown_row_is_a_lookup_error_not_a_fence(conn):
    with pytest.raises(LookupError):
        _take(conn, "no-such-sku", 5, "w")


def test_values_and_names_never_become_sql(conn):
    sku = _stock(conn)
    hostile = "x'; DROP TABLE stock; --"
    with conn.transaction(), conn.cursor() as cursor:
        fenced_update(
            cursor,
            table="stock",
            where={"sku": sku},
            set={"last_writer": hostile},
            token=3,
            owner_id=hostile,
            resource_type="stock",
            resource_id=sku,
        )
    assert _row(conn, sku) == (10, 3, hostile)
    with pytest.raises(psycopg.errors.UndefinedTable), conn.transaction(), conn.cursor() as c:
        fenced_update(
            c,
            table='stock"; --',
            where={"sku": sku},
            token=4,
            owner_id="w",
            resource_type="stock",
            resource_id=sku,
        )


# ------------------------------------------------------------------------------------- gate


def _intents(conn, operation: str) -> list[tuple]:
    return conn.execute(
        "SELECT outcome, token FROM fence_intent WHERE operation_id = %s ORDER BY created_at",
        [operation],
    ).fetchall()


def test_the_gate_commits_the_intent_before_the_call_and_records_the_outcome(conn, adopter_db):
    gate = SideEffectGate(resource_type="mailer")
    resource, operation = f"user-{uuid.uuid4().hex[:6]}", f"mail-{uuid.uuid4().hex[:6]}"
    seen = []

    def call() -> dict:
        # The intent is committed: another connection sees it while the call runs.
        with psycopg.connect(adopter_db) as other:
            seen.append(_intents(other, operation))
        return {"messageId": "m-1"}

    assert gate.run(
        conn, resource_id=resource, operation_id=operation, token=3, owner_id="w", call=call
    ) == {"messageId": "m-1"}
    assert seen == [[("PENDING", 3)]]
    assert _intents(conn, operation) == [("SUCCEEDED", 3)]


def test_the_gate_refuses_a_stale_token_and_a_second_attempt_without_calling(conn):
    gate = SideEffectGate(resource_type="mailer")
    resource = f"user-{uuid.uuid4().hex[:6]}"
    first, second = f"mail-{uuid.uuid4().hex[:6]}", f"mail-{uuid.uuid4().hex[:6]}"
    calls = []

    def call() -> str:
        calls.append(1)
        return "sent"

    gate.run(conn, resource_id=resource, operation_id=first, token=5, owner_id="b", call=call)
    with pytest.raises(FencedOut) as refused:
        gate.run(conn, resource_id=resource, operation_id=second, token=4, owner_id="a", call=call)
    assert refused.value.highest_token == 5
    with pytest.raises(DuplicateOperation):
        gate.run(conn, resource_id=resource, operation_id=first, token=6, owner_id="b", call=call)
    assert calls == [1]
    assert _intents(conn, first) == [("SUCCEEDED", 5)]
    assert _intents(conn, second) == []


def test_not_sent_may_come_back_under_the_same_token_and_ambiguous_is_quarantined(conn):
    gate = SideEffectGate(resource_type="mailer")
    resource, operation = f"user-{uuid.uuid4().hex[:6]}", f"mail-{uuid.uuid4().hex[:6]}"

    def refused_to_connect() -> None:
        raise NotSent

    def lost_answer() -> None:
        raise TimeoutError("read timed out")

    with pytest.raises(NotSent):
        gate.run(
            conn,
            resource_id=resource,
            operation_id=operation,
            token=7,
            owner_id="w",
            call=refused_to_connect,
        )
    with pytest.raises(Ambiguous):
        gate.run(
            conn,
            resource_id=resource,
            operation_id=operation,
            token=7,
            owner_id="w",
            call=lost_answer,
        )
    with pytest.raises(DuplicateOperation) as again:  # quarantined: never attempted again
        gate.run(
            conn,
            resource_id=resource,
            operation_id=operation,
            token=8,
            owner_id="w",
            call=lambda: "sent",
        )
    assert again.value.details["existingOutcome"] == "AMBIGUOUS"
    assert _intents(conn, operation) == [("NOT_SENT", 7), ("AMBIGUOUS", 7)]


def test_a_declined_operation_is_recorded_failed_and_not_attempted_again(conn):
    gate = SideEffectGate(resource_type="mailer")
    resource, operation = f"user-{uuid.uuid4().hex[:6]}", f"mail-{uuid.uuid4().hex[:6]}"

    def declined() -> None:
        raise Declined({"reason": "bounced"})

    with pytest.raises(Declined):
        gate.run(
            conn, resource_id=resource, operation_id=operation, token=2, owner_id="w", call=declined
        )
    with pytest.raises(DuplicateOperation):
        gate.run(
            conn,
            resource_id=resource,
            operation_id=operation,
            token=3,
            owner_id="w",
            call=lambda: "sent",
        )
    assert _intents(conn, operation) == [("FAILED", 2)]


# ------------------------------------------------------------------------------------ django


@fenced_view(key=lambda request, sku: f"stock:{sku}")
def _take_view(request, sku, *, fencing_token):
    if fencing_token < 5:
        raise FencedOut(
            presented_token=fencing_token,
            highest_token=5,
            resource_type="stock",
            resource_id=sku,
            owner_id="w",
        )
    return JsonResponse({"token": fencing_token})


@override_settings(DLOCK_FENCING_PUBLIC_KEYS=PUBLIC.setting_value())
def test_the_decorator_hands_the_view_its_token_and_answers_refusals_with_the_c3_envelope():
    factory = RequestFactory()

    def post(token: int, proof: str):
        request = factory.post(
            "/stock/a", HTTP_X_FENCING_TOKEN=str(token), HTTP_X_FENCING_PROOF=proof
        )
        return _take_view(request, "a")

    ok = post(6, LOCK_SERVER.sign(key="stock:a", token=6))
    assert ok.status_code == 200 and json.loads(ok.content) == {"token": 6}
    forged = post(6, "v2.k2." + "A" * 86)
    body = json.loads(forged.content)
    assert forged.status_code == 400 and body["code"] == "INVALID_TOKEN"
    assert body["retrySafe"] is False and body["details"]["reason"] == "mismatch"
    assert len(body["traceId"]) == 32
    other_key = post(6, LOCK_SERVER.sign(key="stock:b", token=6))
    assert other_key.status_code == 400
    stale = post(4, LOCK_SERVER.sign(key="stock:a", token=4))
    assert stale.status_code == 409 and json.loads(stale.content)["code"] == "FENCED_OUT"
    assert json.loads(stale.content)["details"]["highestToken"] == 5


@override_settings(DLOCK_FENCING_PUBLIC_KEYS=PUBLIC.setting_value())
def test_a_worker_without_a_csrf_cookie_reaches_the_fence_not_a_403_page():
    """A new project has CsrfViewMiddleware on; a worker's POST carries a proof, no CSRF token."""
    request = RequestFactory().post(
        "/stock/a",
        HTTP_X_FENCING_TOKEN="6",
        HTTP_X_FENCING_PROOF=LOCK_SERVER.sign(key="stock:a", token=6),
    )
    request._dont_enforce_csrf_checks = False
    middleware = CsrfViewMiddleware(lambda request: _take_view(request, "a"))
    assert middleware.process_view(request, _take_view, ("a",), {}) is None
    assert _take_view(request, "a").status_code == 200


@fenced_view(key=lambda request, sku: f"stock:{sku}")
def _write_then_refused(request, sku, *, fencing_token):
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO fence_probe VALUES (%s)", [fencing_token])
    raise FencedOut(
        presented_token=fencing_token,
        highest_token=9,
        resource_type="stock",
        resource_id=sku,
        owner_id="w",
    )


@pytest.mark.django_db
@override_settings(DLOCK_FENCING_PUBLIC_KEYS=PUBLIC.setting_value())
def test_a_refusal_answered_by_the_decorator_rolls_back_an_enclosing_atomic_request():
    with connection.cursor() as cursor:
        cursor.execute("CREATE TEMP TABLE fence_probe (token bigint)")
    request = RequestFactory().post(
        "/stock/a",
        HTTP_X_FENCING_TOKEN="6",
        HTTP_X_FENCING_PROOF=LOCK_SERVER.sign(key="stock:a", token=6),
    )
    with transaction.atomic():  # what ATOMIC_REQUESTS wraps a view in
        answer = _write_then_refused(request, "a")
    assert answer.status_code == 409
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM fence_probe")
        assert cursor.fetchone() == (0,)


# ------------------------------------------------------------ the gate's hooks (rail-proxy's)


def _mark_of(conn, resource: str) -> int | None:
    row = conn.execute(
        "SELECT highest_token FROM fence_high_water WHERE resource_id = %s", [resource]
    ).fetchone()
    return row[0] if row else None


def _keep_refusal(cursor, refusal: FencedOut, reason: str) -> None:
    """An adopter's on_fenced: the refusal stays on record, outside the live outcomes."""
    cursor.execute(
        "INSERT INTO fence_intent (intent_id, operation_id, resource_id, token, owner_id, outcome,"
        " result) VALUES (%s, %s, %s, %s, %s, 'FENCED', %s)",
        [
            uuid.uuid4(),
            refusal.details["resourceId"],
            refusal.resource_id,
            refusal.presented_token,
            refusal.owner_id,
            json.dumps({"reason": reason, "highest": refusal.highest_token}),
        ],
    )


def test_a_superseded_operation_is_fenced_after_step_two_its_refusal_kept_the_mark_unmoved(conn):
    """The operation's own record belongs to a newer token (a re-claimed payout): step 1 only
    asks the mark, the refusal names the record's token, is kept on record, and blocks no later
    legitimate attempt."""
    gate = SideEffectGate(resource_type="mailer")
    resource, operation = f"user-{uuid.uuid4().hex[:6]}", f"mail-{uuid.uuid4().hex[:6]}"
    gate.run(
        conn,
        resource_id=resource,
        operation_id="warm-up-" + operation,
        token=3,
        owner_id="a",
        call=lambda: "sent",
    )
    with conn.transaction(), conn.cursor() as cursor, pytest.raises(FencedOut) as refused:
        gate.admit(
            cursor,
            resource_id=resource,
            operation_id=operation,
            token=5,  # would advance the mark: a superseded admission must not
            owner_id="a",
            superseded=Superseded(resource_id=operation, highest_token=9, reason="fenced_claim"),
            on_fenced=_keep_refusal,
        )
    assert (refused.value.resource_id, refused.value.highest_token) == (operation, 9)
    assert _mark_of(conn, resource) == 3
    kept = conn.execute(
        "SELECT outcome, result FROM fence_intent WHERE operation_id = %s AND token = 5",
        [operation],
    ).fetchall()
    assert kept == [("FENCED", {"reason": "fenced_claim", "highest": 9})]
    # The newer holder's attempt goes through: the kept refusal is not live.
    assert (
        gate.run(
            conn,
            resource_id=resource,
            operation_id=operation,
            token=9,
            owner_id="b",
            call=lambda: "sent",
        )
        == "sent"
    )
    assert _intents(conn, operation) == [("FENCED", 5), ("SUCCEEDED", 9)]


def test_a_stale_token_is_fenced_at_step_one_even_when_superseded(conn):
    gate = SideEffectGate(resource_type="mailer", fenced_message="the mailer saw a newer token")
    resource, operation = f"user-{uuid.uuid4().hex[:6]}", f"mail-{uuid.uuid4().hex[:6]}"
    gate.run(
        conn,
        resource_id=resource,
        operation_id="first-" + operation,
        token=8,
        owner_id="b",
        call=lambda: "sent",
    )
    reasons = []
    with conn.transaction(), conn.cursor() as cursor, pytest.raises(FencedOut) as refused:
        gate.admit(
            cursor,
            resource_id=resource,
            operation_id=operation,
            token=4,
            owner_id="a",
            superseded=Superseded(resource_id=operation, highest_token=6, reason="fenced_claim"),
            on_fenced=lambda cursor, refusal, reason: reasons.append(reason),
        )
    assert reasons == ["fenced_high_water"]
    assert (refused.value.resource_id, refused.value.highest_token) == (resource, 8)
    assert refused.value.message == "the mailer saw a newer token"
    assert _mark_of(conn, resource) == 8


def test_a_precondition_refusal_rolls_the_admission_back_whole(conn):
    gate = SideEffectGate(resource_type="mailer")
    resource, operation = f"user-{uuid.uuid4().hex[:6]}", f"mail-{uuid.uuid4().hex[:6]}"
    seen = []

    def not_ready(cursor, intent: Intent) -> None:
        seen.append(intent.token)
        raise ValueError("the record is not ready for this token")

    with pytest.raises(ValueError), conn.transaction(), conn.cursor() as cursor:
        gate.admit(
            cursor,
            resource_id=resource,
            operation_id=operation,
            token=4,
            owner_id="a",
            precondition=not_ready,
        )
    assert seen == [4]
    assert _mark_of(conn, resource) is None and _intents(conn, operation) == []


def test_a_gate_on_tables_of_your_own_writes_and_resolves_its_own_rows(conn):
    """Configurable tables: the default statements built from the adopter's column names, or
    the adopter's own writer and resolver; NOT_SENT re-opens only what a resolve moved."""
    suffix = uuid.uuid4().hex[:6]
    marks, attempts = f"job_mark_{suffix}", f"job_attempt_{suffix}"
    conn.execute(
        f"CREATE TABLE {marks} (job text PRIMARY KEY, top bigint NOT NULL, again text,"
        " updated_at timestamptz)"
    )
    conn.execute(
        f"CREATE TABLE {attempts} (attempt uuid PRIMARY KEY, step text, job text, tok bigint,"
        " who text, state text, answer jsonb, done_at timestamptz)"
    )
    gate = SideEffectGate(
        resource_type="jobs",
        mark=HighWaterMark(
            table=marks, resource_column="job", token_column="top", retry_column="again"
        ),
        intents=IntentLog(
            table=attempts,
            id_column="attempt",
            operation_column="step",
            outcome_column="state",
            token_column="tok",
            resource_column="job",
            owner_column="who",
            result_column="answer",
            resolved_column="done_at",
        ),
    )
    assert gate.run(
        conn, resource_id="j1", operation_id="s1", token=2, owner_id="w", call=lambda: {"ok": 1}
    ) == {"ok": 1}
    with pytest.raises(FencedOut):
        gate.run(
            conn, resource_id="j1", operation_id="s2", token=2, owner_id="w", call=lambda: "never"
        )
    assert conn.execute(
        f"SELECT state, tok, answer FROM {attempts} WHERE step = 's1'"
    ).fetchall() == [("SUCCEEDED", 2, {"ok": 1})]

    # The table's own writer and resolver: a resolve that moved nothing re-opens nothing.
    with conn.transaction(), conn.cursor() as cursor:
        intent = gate.admit(
            cursor,
            resource_id="j1",
            operation_id="s3",
            token=3,
            owner_id="w",
            write_intent=lambda cursor, intent: "written by the adopter",
        )
    assert intent.written == "written by the adopter"
    with conn.transaction(), conn.cursor() as cursor:
        assert gate.record(cursor, intent, outcome="NOT_SENT", resolve=lambda cursor: None) is None
        assert gate.record(cursor, intent, outcome="NOT_SENT", resolve=lambda cursor: (1,)) == (1,)
    assert conn.execute(f"SELECT top, again FROM {marks} WHERE job = 'j1'").fetchone() == (3, "s3")
    with pytest.raises(ValueError):
        IntentLog(table=attempts, owner_column="who; DROP TABLE stock")
