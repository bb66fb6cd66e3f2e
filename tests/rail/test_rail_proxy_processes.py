"""The high-water mark and intents outlive proxy processes: restarts, a second proxy, crashes."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from devstack.common import free_port
from tests.rail.helpers import start_proxy

pytestmark = pytest.mark.live


@pytest.fixture(scope="module")
def other_proxy(rail_stack):
    """A second rail-proxy process on the same paydb and stub."""
    proc = start_proxy(rail_stack)
    yield proc
    proc.stop()


def test_restarted_proxy_fences_a_stale_token_and_sweeps_old_intents_at_start_up(rail_stack, rail):
    first = rail.claimed_payout(token=1_000)
    assert rail.submit(first).status_code == 200
    orphan = rail.claimed_payout(token=1_500)
    rail_stack.procs["railproxy"].stop()
    rail.orphan_intent(orphan)  # what a proxy killed an hour ago left behind

    # Only the start-up sweep can catch it: this process's periodic sweep is 10 minutes away.
    restarted = start_proxy(rail_stack, RAIL_SWEEP_INTERVAL_MS="600000")
    try:
        rail.wait_for(lambda: rail.payout_state(orphan.payout_id) == "RAIL_AMBIGUOUS")
        assert rail.submissions(orphan.payout_id)[0][:3] == ("TIMEOUT", 1_500, "sweep")
        stale = rail.claimed_payout(token=999, account_id=first.account_id)
        response = rail.submit(stale, url=restarted.url)
        assert response.status_code == 409 and response.json()["code"] == "FENCED_OUT"
        assert response.json()["details"]["highestToken"] == 1_000
        assert rail.stub_requests(stale.payout_id) == []
        newer = rail.claimed_payout(token=1_001, account_id=first.account_id)
        assert rail.submit(newer, url=restarted.url).status_code == 200
    finally:
        restarted.stop()
        rail_stack.procs["railproxy"].start()
    assert rail.stub_requests(orphan.payout_id) == []  # swept, never forwarded


def test_second_proxy_process_rejects_a_stale_token_exactly_as_the_first(rail, other_proxy):
    first = rail.claimed_payout(token=2_000)
    assert rail.submit(first).status_code == 200
    stale_a = rail.claimed_payout(token=1_999, account_id=first.account_id)
    stale_b = rail.claimed_payout(token=1_999, account_id=first.account_id)

    here = rail.submit(stale_a)
    there = rail.submit(stale_b, url=other_proxy.url)

    assert here.status_code == there.status_code == 409
    assert here.json()["code"] == there.json()["code"] == "FENCED_OUT"
    assert here.json()["details"] == there.json()["details"]
    assert rail.stub_requests(stale_a.payout_id) == rail.stub_requests(stale_b.payout_id) == []
    # And a newer token admitted by the second process fences the first process's callers.
    newer = rail.claimed_payout(token=2_001, account_id=first.account_id)
    assert rail.submit(newer, url=other_proxy.url).status_code == 200
    late = rail.claimed_payout(token=2_000, account_id=first.account_id)
    assert rail.submit(late).json()["details"]["highestToken"] == 2_001


def test_identical_requests_racing_on_two_proxies_present_the_payout_once(rail, other_proxy):
    rail.stub_config(latency_ms=300)
    payout = rail.claimed_payout(token=3_000)
    answers = {}

    def send(name, url):
        answers[name] = rail.submit(payout, url=url)

    threads = [
        threading.Thread(target=send, args=("a", rail.proxy_url)),
        threading.Thread(target=send, args=("b", other_proxy.url)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    codes = sorted(
        str(r.status_code) if r.status_code == 200 else r.json()["code"] for r in answers.values()
    )
    # One forwarded; its twin either replayed the ack or learned it is in flight. Never fenced.
    assert codes in (["200", "200"], ["200", "RAIL_AMBIGUOUS"])
    assert rail.stub_requests(payout.payout_id) == ["ok"]
    assert [s[0] for s in rail.submissions(payout.payout_id)] == ["ACKED"]


def test_connect_refused_is_503_not_sent_and_the_same_request_is_admitted_later(rail_stack, rail):
    dead_rail = start_proxy(rail_stack, RAIL_STUB_URL=f"http://127.0.0.1:{free_port()}")
    try:
        payout = rail.claimed_payout(token=4_000)
        response = rail.submit(payout, url=dead_rail.url)
    finally:
        dead_rail.stop()

    assert response.status_code == 503
    error = response.json()
    assert error["code"] == "RAIL_UNAVAILABLE" and error["retrySafe"] is True
    assert error["retryAfterMillis"] > 0 and error["details"]["outcome"] == "NOT_SENT"
    assert rail.submissions(payout.payout_id)[0][:3] == ("NOT_SENT", 4_000, "connect_failed")
    assert rail.payout_state(payout.payout_id) == "CLAIMED"
    assert rail.high_water(payout.account_id)[0] == 4_000

    # The equality arm admits this payout, and only this payout, under the same token.
    sibling = rail.claimed_payout(token=4_000, account_id=payout.account_id)
    assert rail.submit(sibling).json()["code"] == "FENCED_OUT"
    retried = rail.submit(payout)

    assert retried.status_code == 200 and "Idempotent-Replayed" not in retried.headers
    assert [s[0] for s in rail.submissions(payout.payout_id)] == ["NOT_SENT", "ACKED"]
    assert rail.stub_requests(payout.payout_id) == ["ok"]
    assert rail.high_water(payout.account_id) == (4_000, None)
    assert rail.payout_state(payout.payout_id) == "RAIL_ACKED"


def test_intent_of_a_crashed_proxy_is_swept_to_ambiguous_and_never_re_forwarded(rail_stack, rail):
    rail.stub_config(latency_ms=4_000)  # the rail is still working when the proxy dies
    doomed = start_proxy(rail_stack, RAIL_SWEEP_ENABLED="false")
    payout = rail.claimed_payout(token=5_000)
    sender = threading.Thread(target=lambda: _swallow(lambda: rail.submit(payout, url=doomed.url)))
    sender.start()
    try:
        rail.wait_for(lambda: rail.submissions(payout.payout_id) != [])
        assert rail.submissions(payout.payout_id)[0][0] == "PENDING"
        assert rail.payout_state(payout.payout_id) == "SUBMITTING"
        os.killpg(doomed.process.pid, signal.SIGKILL)  # crash between intent and outcome
        doomed.process.wait()
    finally:
        sender.join()
        doomed.stop()

    # The surviving proxy's sweeper quarantines it once it is older than connect+read+margin.
    rail.wait_for(lambda: rail.payout_state(payout.payout_id) == "RAIL_AMBIGUOUS", timeout=15)
    assert rail.submissions(payout.payout_id)[0][:3] == ("TIMEOUT", 5_000, "sweep")
    events = rail.payout_events(payout.payout_id)
    assert events[-1][:2] == ("SUBMITTING", "RAIL_AMBIGUOUS")

    rail.stub_config()
    rail.reclaim(payout, 5_001)
    again = rail.submit(payout, token=5_001)
    replay = rail.submit(payout, token=5_000)
    assert again.json()["code"] == "DUPLICATE_SUBMISSION"
    assert replay.json()["code"] == "RAIL_AMBIGUOUS"
    assert replay.headers["Idempotent-Replayed"] == "true"
    # The rail got exactly one request, and booked it after the proxy was gone.
    rail.wait_for(lambda: rail.stub_requests(payout.payout_id) == ["ok"])
    assert len(rail.transfers(payout.payout_id)) == 1


# The `rail_sweep` command and the server-process sweeper: tests/rail/test_rail_sweep.py.


def _swallow(call):
    try:
        call()
    except Exception:  # the proxy died under the request: that is the point
        return None
