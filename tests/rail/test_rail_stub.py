"""The rail stub over HTTP: a hostile, memoryless rail whose statement is the ground truth."""

from __future__ import annotations

import json
import uuid

import pytest
import requests

pytestmark = pytest.mark.live


def _submit(rail_stack, client_ref: str, **override) -> requests.Response:
    body = {"clientRef": client_ref, "amountMinor": 990, "currency": "EUR", **override}
    return requests.post(f"{rail_stack.url('railstub')}/submit", json=body, timeout=10)


def _ref() -> str:
    return f"ref-{uuid.uuid4()}"


def test_well_behaved_rail_acks_and_books_every_call_even_a_repeat(rail_stack, rail):
    ref = _ref()

    first = _submit(rail_stack, ref)
    second = _submit(rail_stack, ref)

    assert first.status_code == 200 and second.status_code == 200
    assert set(first.json()) == {"railReference", "acceptedAt"}
    assert first.json()["acceptedAt"].endswith("Z") and len(first.json()["acceptedAt"]) == 24
    assert first.json()["railReference"] != second.json()["railReference"]
    # Non-idempotent by design: the repeat is a second payment, marked as such on the statement.
    assert rail.transfers(ref) == [
        (first.json()["railReference"], None),
        (second.json()["railReference"], first.json()["railReference"]),
    ]


def test_declined_call_is_402_and_books_nothing(rail_stack, rail):
    rail.stub_config(decline_rate=1.0)
    ref = _ref()

    response = _submit(rail_stack, ref)

    assert response.status_code == 402
    assert rail.transfers(ref) == []
    assert rail.stub_requests(ref) == ["declined"]


def test_injected_5xx_books_nothing(rail_stack, rail):
    rail.stub_config(failure_rate=1.0, split_5xx=1, split_drop_before=0, split_drop_after=0)
    ref = _ref()

    assert _submit(rail_stack, ref).status_code == 500
    assert rail.transfers(ref) == []


def test_drop_before_booking_closes_the_connection_without_an_answer_and_books_nothing(
    rail_stack, rail
):
    rail.stub_config(
        failure_rate=1.0, split_5xx=0, split_drop_before=1, split_drop_after=0, hold_ms=200
    )
    ref = _ref()

    with pytest.raises(requests.ConnectionError):
        _submit(rail_stack, ref)

    assert rail.transfers(ref) == []
    assert rail.stub_requests(ref) == ["drop_before_booking"]


def test_drop_after_booking_moves_money_and_the_caller_never_learns(rail_stack, rail):
    rail.stub_config(failure_rate=1.0, split_5xx=0, split_drop_before=0, split_drop_after=1)
    ref = _ref()

    with pytest.raises(requests.ConnectionError):
        _submit(rail_stack, ref)

    assert len(rail.transfers(ref)) == 1
    # The stub keeps serving afterwards: the drop closed one connection, not the listener.
    rail.stub_config()
    assert _submit(rail_stack, _ref()).status_code == 200


def test_duplicate_ack_books_a_second_transfer_with_a_new_reference(rail_stack, rail):
    rail.stub_config(duplicate_ack_rate=1.0)
    ref = _ref()

    response = _submit(rail_stack, ref)

    assert response.status_code == 200
    transfers = rail.transfers(ref)
    assert len(transfers) == 2
    assert transfers[0] == (response.json()["railReference"], None)
    assert transfers[1][0] != transfers[0][0] and transfers[1][1] == transfers[0][0]


def test_same_seed_replays_the_same_fault_sequence(rail_stack, rail):
    def run() -> list[int]:
        rail.stub_config(
            failure_rate=0.5, decline_rate=0.3, split_drop_before=0, split_drop_after=0, seed=42
        )
        return [_submit(rail_stack, _ref()).status_code for _ in range(12)]

    first, second = run(), run()

    assert first == second
    assert {200, 402, 500} <= set(first)


@pytest.mark.parametrize(
    "override",
    [
        {"amountMinor": 0},
        {"amountMinor": -1},
        {"amountMinor": "990"},
        {"currency": "eur"},
        {"currency": "EURO"},
        {"clientRef": ""},
        {"clientRef": 7},
        {"token": "extra"},
    ],
)
def test_malformed_request_is_a_validation_envelope_and_never_reaches_the_books(
    rail_stack, rail, override
):
    ref = _ref()
    response = _submit(rail_stack, ref, **override)

    assert response.status_code == 400
    assert response.json()["code"] == "VALIDATION_FAILED"
    assert rail.stub_requests(ref) == [] and rail.transfers(ref) == []


def test_config_command_changes_faults_while_the_stub_runs(rail_stack, rail):
    result = rail_stack.manage(
        "railstub_config",
        "--reset",
        "--seed",
        "7",
        "--failure-rate",
        "1",
        "--split-5xx",
        "1",
        "--split-drop-before",
        "0",
        "--split-drop-after",
        "0",
        "--latency-ms",
        "0",
    )
    shown = json.loads(result.stdout)
    assert shown["failureRate"] == 1.0 and shown["seed"] == 7 and shown["declineRate"] == 0.0
    assert _submit(rail_stack, _ref()).status_code == 500

    rail.stub_config()
    assert _submit(rail_stack, _ref()).status_code == 200

    bad = rail_stack.manage("railstub_config", "--failure-rate", "1.5", check=False)
    assert bad.returncode != 0 and "fraction" in bad.stderr


def test_rail_statement_exports_the_books_as_json(rail_stack, rail):
    ref = _ref()
    booked = _submit(rail_stack, ref).json()["railReference"]

    result = rail_stack.manage("rail_statement", "--json", "--client-ref", ref)

    statement = json.loads(result.stdout)
    assert [t["railReference"] for t in statement["transfers"]] == [booked]
    assert statement["transfers"][0]["amountMinor"] == 990
    assert statement["summary"]["transferCount"] == 1
