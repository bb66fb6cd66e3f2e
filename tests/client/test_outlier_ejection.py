"""Outlier ejection in `dlock.client.Endpoints` (issue 27.1, decision 21) against scripted peers
on loopback: a replica that timed out, refused or answered 503/504 gets no new calls while its
demotion lasts; the call whose bytes left is never re-sent; a trial call (or a health probe)
brings it back. Time is the Endpoints' injected clock, so nothing here waits for a period.
"""

from __future__ import annotations

import threading

import pytest

from dlock.budgets import Budget
from dlock.client import Endpoints, ServiceUnreachable
from dlock.client.transport import EJECT_BASE_S, EJECT_MAX_S
from tests.client.test_http_transport import ScriptedPeer, _json

FAST = Budget(0.5, 0.3, 0, "test")
OVERLOADED = (
    b'{"code":"OVERLOADED","message":"m","retrySafe":true,"retryAfterMillis":10,"traceId":"t"}'
)


class Switch:
    """A peer's behaviour, changeable while it runs: 'ok', 'silent', '503', '504'."""

    def __init__(self, mode: str = "ok") -> None:
        self.mode = mode
        self.released = threading.Event()

    def __call__(self, n: int, request: bytes) -> bytes | None:
        if self.mode == "silent":
            self.released.wait(5)  # holds the answer past the caller's read budget
            return None
        if self.mode == "503":
            return _json(503, OVERLOADED)
        if self.mode == "504":
            return _json(504, b'{"code":"UPSTREAM_TIMEOUT","message":"m","retrySafe":false}')
        return _json(200, b'{"n":%d}' % n)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def peers():
    started: list[tuple[ScriptedPeer, Switch]] = []

    def start(mode: str = "ok") -> tuple[ScriptedPeer, Switch]:
        switch = Switch(mode)
        started.append((ScriptedPeer(switch), switch))
        return started[-1]

    yield start
    for peer, switch in started:
        switch.released.set()
        peer.close()


def _posts(peer: ScriptedPeer) -> int:
    return sum(1 for r in peer.requests if r.startswith(b"POST "))


def test_a_replica_that_timed_out_gets_no_new_calls_and_its_call_is_not_resent(peers):
    (a, sa), (b, _) = peers("silent"), peers("ok")
    clock = Clock()
    endpoints = Endpoints([a.url, b.url], name="lockserver", clock=clock, random_fn=lambda: 1.0)
    with pytest.raises(ServiceUnreachable) as caught:
        endpoints.call("POST", "/v1/x", hop=FAST, json_body={})
    assert caught.value.sent is True  # outcome unknown: not failed over
    assert _posts(a) == 1 and _posts(b) == 0
    assert endpoints.demoted() == [a.url]
    for _ in range(5):  # the next calls go to the healthy replica, none to the stalled one
        assert endpoints.call("POST", "/v1/x", hop=FAST, json_body={}).ok
    assert _posts(a) == 1 and _posts(b) == 5
    # The period is over: one trial call goes to it; it answers again, so it is restored.
    sa.mode = "ok"
    sa.released.set()
    clock.now += EJECT_BASE_S
    endpoints.call("POST", "/v1/x", hop=FAST, json_body={})
    assert _posts(a) == 2 and endpoints.demoted() == []


def test_a_failed_trial_demotes_it_again_for_longer_bounded(peers):
    (a, _), (b, _) = peers("503"), peers("ok")
    clock = Clock()
    endpoints = Endpoints([a.url, b.url], clock=clock, random_fn=lambda: 1.0)
    periods = []
    for _ in range(8):
        before = _posts(a)
        endpoints.call("POST", "/v1/x", hop=FAST, json_body={})  # 503 → failed over to b
        assert _posts(a) == before + 1
        periods.append(endpoints.health[0].until - clock.now)
        clock.now = endpoints.health[0].until  # exactly when its trial is due
    assert periods[:4] == [EJECT_BASE_S, 2 * EJECT_BASE_S, 4 * EJECT_BASE_S, 8 * EJECT_BASE_S]
    assert max(periods) == EJECT_MAX_S
    assert _posts(b) == 8  # every call was answered, by the other replica


def test_jitter_spreads_the_demotion_between_half_and_all_of_the_period(peers):
    (a, _), (b, _) = peers("503"), peers("ok")
    for draw, expected in ((0.0, 0.5), (0.5, 0.75), (1.0, 1.0)):
        clock = Clock()
        endpoints = Endpoints([a.url, b.url], clock=clock, random_fn=lambda d=draw: d)
        endpoints.call("POST", "/v1/x", hop=FAST, json_body={})
        assert endpoints.health[0].until - clock.now == pytest.approx(expected * EJECT_BASE_S)


def test_a_proxy_504_demotes_and_is_never_failed_over(peers):
    (a, _), (b, _) = peers("504"), peers("ok")
    endpoints = Endpoints([a.url, b.url], clock=Clock())
    with pytest.raises(ServiceUnreachable) as caught:
        endpoints.call("POST", "/v1/rail/submissions", failover_after_send=False, json_body={},
                       hop=FAST)  # fmt: skip
    assert caught.value.sent is True and _posts(b) == 0
    assert endpoints.demoted() == [a.url]


def test_with_every_endpoint_demoted_the_least_recently_failed_one_is_called(peers):
    (a, sa), (b, sb) = peers("504"), peers("ok")
    clock = Clock()
    endpoints = Endpoints([a.url, b.url], clock=clock, random_fn=lambda: 1.0)
    with pytest.raises(ServiceUnreachable):
        endpoints.call("POST", "/v1/x", hop=FAST, json_body={})  # a fails at t (not failed over)
    clock.now += 0.1
    sb.mode = "504"
    with pytest.raises(ServiceUnreachable):
        endpoints.call("POST", "/v1/x", hop=FAST, json_body={})  # b fails at t + 0.1
    assert set(endpoints.demoted()) == {a.url, b.url}
    clock.now += 0.1  # both still demoted: a call still goes out, to a (failed longest ago)
    sa.mode = sb.mode = "ok"
    assert endpoints.call("POST", "/v1/x", hop=FAST, json_body={}).ok
    assert (_posts(a), _posts(b)) == (2, 1)
    assert endpoints.demoted() == [b.url]


def test_a_health_probe_comes_before_real_calls_so_a_payout_is_never_the_probe(peers):
    (a, sa), (b, _) = peers("silent"), peers("ok")
    clock = Clock()
    endpoints = Endpoints(
        [a.url, b.url], clock=clock, random_fn=lambda: 1.0, probe_path="/health/live"
    )
    with pytest.raises(ServiceUnreachable):
        endpoints.call("POST", "/v1/rail/submissions", failover_after_send=False, json_body={},
                       hop=FAST)  # fmt: skip
    clock.now += EJECT_BASE_S  # due for a trial: a GET of its health path, still silent
    assert endpoints.call("POST", "/v1/rail/submissions", hop=FAST, json_body={}).ok
    assert _posts(a) == 1  # only the first submission ever reached a
    assert [r.split(b" ")[1] for r in a.requests] == [b"/v1/rail/submissions", b"/health/live"]
    assert endpoints.demoted() == [a.url]
    sa.mode = "ok"
    sa.released.set()
    clock.now = endpoints.health[0].until
    endpoints.call("POST", "/v1/rail/submissions", hop=FAST, json_body={})
    assert endpoints.demoted() == []
    assert a.requests[-1].startswith(b"POST /v1/rail/submissions")  # after a good probe
