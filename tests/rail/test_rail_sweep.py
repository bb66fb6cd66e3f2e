"""Where the sweep runs (the rail-proxy server process), the command's rows, the kits' shapes.

Kept apart from test_rail_proxy_processes.py: these tests stop the stack's only proxy and need
no second proxy sweeping behind their back.
"""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.live

SHAPE = {"payoutId", "state", "expectedStates", "claimToken", "presentedToken"}


def _events(proc, event: str) -> list[dict]:
    found = []
    for line in proc.logfile.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("event") == event:
            found.append(record)
    return found


def _sweep_event(rail, payout_id: str) -> list[tuple]:
    return rail.pay(
        "SELECT from_state, to_state, token, owner_id FROM payout_event"
        " WHERE payout_id = %s AND to_state = 'RAIL_AMBIGUOUS'",
        [payout_id],
    )


def test_the_sweeper_thread_runs_in_the_rail_proxy_server_process(rail_stack, rail):
    server = rail_stack.procs["railproxy"]
    started = _events(server, "rail_sweeper_started")
    assert started and {e["service"] for e in started} == {"rail-proxy"}
    assert started[0]["intervalMs"] == 300

    orphan = rail.claimed_payout(token=61_000)
    rail.orphan_intent(orphan, age="1 hour")

    # Nobody runs a command: only the server's own thread can quarantine it.
    rail.wait_for(lambda: rail.payout_state(orphan.payout_id) == "RAIL_AMBIGUOUS")
    assert rail.submissions(orphan.payout_id)[0][:3] == ("TIMEOUT", 61_000, "sweep")
    assert _sweep_event(rail, orphan.payout_id) == [
        ("SUBMITTING", "RAIL_AMBIGUOUS", None, "rail-proxy:sweep")
    ]
    rail.wait_for(lambda: any(e["swept"] >= 1 for e in _events(server, "rail_sweep")))


def test_rail_sweep_command_quarantines_old_intents_and_leaves_fresh_ones(rail_stack, rail):
    proxy = rail_stack.procs["railproxy"]
    proxy.stop()  # the only other sweeper: from here on, only the command can move these rows
    try:
        old = rail.claimed_payout(token=62_000)
        fresh = rail.claimed_payout(token=62_001)
        rail.orphan_intent(old, age="1 hour")
        rail.orphan_intent(fresh, age="0 seconds")

        result = rail_stack.manage("rail_sweep", "--older-than-ms", "60000")

        assert rail.submissions(old.payout_id)[0][:3] == ("TIMEOUT", 62_000, "sweep")
        assert rail.payout_state(old.payout_id) == "RAIL_AMBIGUOUS"
        assert _sweep_event(rail, old.payout_id) == [
            ("SUBMITTING", "RAIL_AMBIGUOUS", None, "rail-proxy:sweep")
        ]
        assert rail.submissions(fresh.payout_id)[0][:3] == ("PENDING", 62_001, None)
        assert rail.payout_state(fresh.payout_id) == "SUBMITTING"
        assert rail.stub_requests(old.payout_id) == rail.stub_requests(fresh.payout_id) == []
        assert "swept 1 unresolved intent(s)" in result.stdout
        # A management command never starts the background thread.
        assert "rail_sweeper_started" not in result.stdout + result.stderr

        again = rail_stack.manage("rail_sweep", "--older-than-ms", "60000")
        assert "swept 0 unresolved intent(s)" in again.stdout
        assert rail.payout_state(old.payout_id) == "RAIL_AMBIGUOUS"  # swept exactly once
        assert len(_sweep_event(rail, old.payout_id)) == 1
    finally:
        proxy.start()


def test_a_fenced_rail_attempt_logs_the_kits_fenced_out_line_at_warning(rail_stack, rail):
    first = rail.claimed_payout(token=63_000)
    assert rail.submit(first).status_code == 200
    stale = rail.claimed_payout(token=62_999, account_id=first.account_id)

    response = rail.submit(stale, owner="sleepy")

    assert response.status_code == 409 and response.json()["code"] == "FENCED_OUT"

    def line() -> list[dict]:
        return [
            e
            for e in _events(rail_stack.procs["railproxy"], "fenced_out")
            if e.get("payoutId") == stale.payout_id
        ]

    rail.wait_for(lambda: line() != [])
    (event,) = line()
    assert event["level"] == "WARNING"
    assert (event["resource"], event["resourceId"]) == ("rail", first.account_id)
    assert (event["presentedToken"], event["highestToken"]) == (62_999, 63_000)
    assert event["ownerId"] == "sleepy" and event["reason"] == "fenced_high_water"
    assert event["traceId"] == response.json()["traceId"]


def test_rail_not_claimable_has_the_payments_details_shape(rail):
    payout = rail.claimed_payout(token=64_000)

    body = rail.submit(payout, token=64_001).json()

    assert body["code"] == "PAYOUT_NOT_CLAIMABLE"
    assert set(body["details"]) == SHAPE
    assert body["details"] == {
        "payoutId": payout.payout_id,
        "state": "CLAIMED",
        "expectedStates": ["CLAIMED"],
        "claimToken": 64_000,
        "presentedToken": 64_001,
    }


def test_a_foreign_idempotency_key_is_refused_before_any_row(rail):
    payout = rail.claimed_payout(token=65_000)
    other = rail.claimed_payout(token=65_000, account_id=payout.account_id)

    for key in ("k1", other.key):
        response = rail.submit(payout, key=key)
        assert response.status_code == 400 and response.json()["code"] == "VALIDATION_FAILED"
        assert response.json()["details"]["fields"] == [
            {"field": "X-Idempotency-Key", "message": "must be the payout's stable idempotencyKey"}
        ]
    assert rail.submissions(payout.payout_id) == []
    assert rail.high_water(payout.account_id) in (None, (0, None))
    assert rail.submit(payout).status_code == 200
