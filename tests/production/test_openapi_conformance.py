"""Schemathesis against each role's own /v1/schema on the live stack (bounded examples).

Generated requests, valid (positive) and schema-violating (negative), per operation: no 5xx
other than the named 503/504 envelopes, every non-2xx is the C3 envelope, status, content type
and body match what the schema documents, and schema-violating requests are refused with a 4xx.
Random inputs almost never reach a success, so a scripted walk through every operation's happy
path checks the documented 2xx bodies against what the services really answer.
"""

from __future__ import annotations

import json
import os
import uuid

import hypothesis
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase
from schemathesis import GenerationMode, checks
from schemathesis.core.failures import FailureGroup

from dlock import proof
from dlock.schema import ENVELOPE_SCHEMA
from tests.conftest import ROLES

pytestmark = [pytest.mark.live, pytest.mark.slow]

MAX_EXAMPLES = int(os.environ.get("DLOCK_SCHEMATHESIS_EXAMPLES", "20"))
CHECKS = [
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_schema_conformance,
]
NEGATIVE_CHECKS = [*CHECKS, checks.negative_data_rejection]
# Named capacity answers are not server errors: the envelope says OVERLOADED / DEADLINE_EXCEEDED.
CAPACITY_CODES = {"OVERLOADED", "NOT_LEADER", "DEADLINE_EXCEEDED", "RAIL_UNAVAILABLE"}


def assert_envelope(response) -> None:
    content_type = {k.lower(): v for k, v in response.headers.items()}.get("content-type")
    if isinstance(content_type, list):
        content_type = content_type[0]
    assert content_type == "application/json; charset=utf-8", response.text
    body = response.json()
    assert set(body) <= set(ENVELOPE_SCHEMA["properties"]), body
    assert {"code", "message", "retrySafe", "traceId"} <= set(body), body
    if response.status_code >= 500:
        assert body["code"] in CAPACITY_CODES, body


def load_schema(url: str):
    return schemathesis.openapi.from_url(f"{url}/v1/schema")


def operations(url: str) -> list:
    return [result.ok() for result in load_schema(url).get_all_operations()]


def exercise(operation, base_url: str, mode: GenerationMode) -> list[str]:
    """Run up to MAX_EXAMPLES generated requests; returns the failures (empty when clean)."""
    failures: list[str] = []
    chosen = NEGATIVE_CHECKS if mode is GenerationMode.NEGATIVE else CHECKS
    raw = operation.definition.raw
    if mode is GenerationMode.NEGATIVE and not (raw.get("parameters") or raw.get("requestBody")):
        return failures  # no input to make invalid (GET /v1/fencing-keys)

    @hypothesis.given(case=operation.as_strategy(generation_mode=mode))
    @hypothesis.settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    def run(case):
        response = case.call(base_url=base_url, timeout=15)
        try:
            case.validate_response(response, checks=chosen)
            if response.status_code >= 400:
                assert_envelope(response)  # 5xx only as named capacity answers
        # FailureGroup is a BaseExceptionGroup: `except Exception` alone would let it end the run
        except (Exception, FailureGroup) as exc:  # collect every failure, keep exploring
            failures.append(f"{mode.value} {case.method} {case.formatted_path} -> {exc}")

    run()
    return failures


@pytest.mark.parametrize("mode", list(GenerationMode), ids=lambda m: m.value)
@pytest.mark.parametrize("role", ROLES)
def test_every_operation_of_the_role_conforms_to_its_schema(live_stack, role, mode):
    base_url = live_stack.url(role)
    if role == "railstub":
        # The stub's injected faults (5xx, dropped connections) are the hostile rail by design,
        # not schema violations: exercise the well-behaved rail. Other tests set what they need.
        live_stack.manage("railstub_config", "--reset")
    found = operations(base_url)
    assert found, f"{role} documents no operation"
    failures: list[str] = []
    for operation in found:
        failures += exercise(operation, base_url, mode)
    unique = sorted(set(f.split("\n")[0] for f in failures))
    assert not unique, f"{len(unique)} distinct failures:\n" + "\n".join(failures[:20])


# ------------------------------------------------------------------------------- happy paths


class Walk:
    """Calls operations by operationId, validating every answer against the role's schema."""

    def __init__(self, live_stack) -> None:
        self.stack = live_stack
        self.ops: dict[str, tuple[str, object]] = {}
        self.seen: dict[str, int] = {}
        for role in ROLES:
            for operation in operations(live_stack.url(role)):
                self.ops[operation.definition.raw["operationId"]] = (role, operation)

    def __call__(self, operation_id: str, expect: int, **parts):
        role, operation = self.ops[operation_id]
        case = operation.Case(media_type="application/json" if "body" in parts else None, **parts)
        response = case.call(base_url=self.stack.url(role), timeout=15)
        assert response.status_code == expect, (operation_id, response.status_code, response.text)
        case.validate_response(response, checks=CHECKS)
        self.seen[operation_id] = response.status_code
        return response.json() if response.content else None


def _seed(live_stack) -> dict:
    done = live_stack.manage(
        "seed_payouts",
        "--accounts=1",
        "--payouts-per-account=1",
        "--balance-minor=100000",
        "--amount-minor=2500",
        "--json",
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_every_documented_success_body_is_what_the_services_answer(live_stack):
    live_stack.manage("railstub_config", "--reset")
    call = Walk(live_stack)
    owner = f"schema-{uuid.uuid4().hex[:8]}"
    key = f"payout:schema-{uuid.uuid4().hex[:12]}"
    as_owner = {"X-Owner-Id": owner}

    # lock server, L1–L8
    session = call("openSession", 201, body={"ownerId": owner, "ttlMillis": 10_000})
    sid = session["sessionId"]
    call("heartbeatSession", 200, path_parameters={"session_id": sid}, headers=as_owner)
    grant = call(
        "acquireLock", 200, path_parameters={"key": key}, headers=as_owner, body={"sessionId": sid}
    )
    fenced = {
        **as_owner,
        "X-Fencing-Token": str(grant["fencingToken"]),
        "X-Fencing-Proof": grant["fencingProof"],
    }
    call("renewLock", 200, path_parameters={"key": key}, headers=fenced, body={"sessionId": sid})
    held = call("inspectLock", 200, path_parameters={"key": key})
    assert held["held"] is True and held["fencingToken"] == grant["fencingToken"]
    call("releaseLock", 204, path_parameters={"key": key}, headers=fenced, query={"sessionId": sid})
    assert call("inspectLock", 200, path_parameters={"key": key})["held"] is False
    regrant = call(
        "acquireLock", 200, path_parameters={"key": key}, headers=as_owner, body={"sessionId": sid}
    )
    outcome = call(
        "revokeLock",
        200,
        path_parameters={"key": key},
        body={
            "operator": "schema-test",
            "reason": "conformance walk",
            "expectedToken": regrant["fencingToken"],
        },
    )
    assert outcome["revokedToken"] == regrant["fencingToken"]
    call("closeSession", 204, path_parameters={"session_id": sid}, headers=as_owner)
    published = call("fencingKeys", 200)  # open: the public keys the proofs above verify with
    assert published["signingKid"] in {k["kid"] for k in published["keys"]}

    # payment resource and rail proxy, P1–P5 and the submission, along one payout's life
    seeded = _seed(live_stack)
    account, payout_id = seeded["accounts"][0], seeded["payouts"][0]
    page = call("listPayouts", 200, query={"state": "PENDING", "accountId": account, "limit": 5})
    assert [item["payoutId"] for item in page["items"]] == [payout_id]
    payout = call("getPayout", 200, path_parameters={"payout_id": payout_id})
    token = outcome["newTokenFloor"] + 1_000
    protected = {
        "X-Fencing-Token": str(token),
        # What L4 answers for payout:{account} with this token (the suite shares the ring).
        "X-Fencing-Proof": proof.sign(key=proof.payout_key(account), token=token),
        "X-Owner-Id": owner,
        "X-Idempotency-Key": payout["idempotencyKey"],
    }
    claimed = call(
        "claimPayout",
        200,
        path_parameters={"payout_id": payout_id},
        headers=protected,
        body={"expectedState": "PENDING"},
    )
    acked = call(
        "submitToRail",
        200,
        headers=protected,
        body={
            "payoutId": payout_id,
            "accountId": account,
            "amountMinor": payout["amountMinor"],
            "currency": payout["currency"],
            "beneficiaryRef": payout["beneficiaryRef"],
        },
    )
    assert acked["presentedToken"] == claimed["claimToken"] == token
    posted = call(
        "postPayout",
        200,
        path_parameters={"payout_id": payout_id},
        headers=protected,
        body={"railReference": acked["railReference"], "submissionId": acked["submissionId"]},
    )
    assert {entry["direction"] for entry in posted["entries"]} == {"DEBIT", "CREDIT"}
    after = call("getPayout", 200, path_parameters={"payout_id": payout_id})
    assert after["state"] == "POSTED" and len(after["submissions"]) == 1
    balance = call("getAccount", 200, path_parameters={"account_id": account})
    assert balance["balanceMinor"] == balance["ledgerSumMinor"] == posted["balanceMinor"]

    # the rail itself
    call(
        "railSubmit",
        200,
        body={"clientRef": f"schema-{uuid.uuid4()}", "amountMinor": 100, "currency": "EUR"},
    )
    assert set(call.seen) == set(call.ops), set(call.ops) - set(call.seen)
