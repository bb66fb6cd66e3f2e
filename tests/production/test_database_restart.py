"""A PostgreSQL restart costs no caller: the next calls of every role succeed, and a rail answer
that arrives while paydb is down is recorded when it is back (nothing the rail answered goes to
quarantine).

The stack's lockdb and paydb live on a cluster of the test's own (`pg_ctl restart -m fast` on
it, as an operator or a failover does); the rail stub's raildb stays on the suite's server, as
the rail is another party's. Every role runs under gunicorn behind its nginx. Before the pools
checked a connection before handing it out, each pooled connection was handed out once more
after the restart and its request answered 503; before the recording was retried, the rail's
answer was lost and the sweep quarantined the payout.
"""

from __future__ import annotations

import re
import shutil
import threading
import time
import uuid
from collections.abc import Callable

import pytest
import requests

from devstack.common import free_port
from devstack.postgres import PgCluster, private_datadir
from devstack.roles import manage
from tests.conftest import LiveStack, start_stack, stop_stack
from tests.production.test_admin_role import csrf_session, log_in, make_staff
from tests.rail.conftest import Rail

pytestmark = [pytest.mark.live, pytest.mark.slow]

TIMEOUT = 15
CALLS_AFTER_RESTART = 12  # per role; the pools held more idle connections than this


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    parent = tmp_path_factory.mktemp("restart-pg")
    parent.chmod(0o755)  # as root the cluster runs as `postgres`
    pg = PgCluster(private_datadir(parent, "pg"), free_port(), fast=True)
    pg.start()
    yield pg
    pg.stop("immediate")
    shutil.rmtree(pg.datadir, ignore_errors=True)


def stack_on(cluster: PgCluster, prefix: str, env: dict[str, str] | None = None) -> LiveStack:
    """A stack whose lockdb and paydb are new databases on `cluster`."""
    urls = {
        "LOCK_DATABASE_URL": cluster.create_database(f"{prefix}_lockdb"),
        "PAY_DATABASE_URL": cluster.create_database(f"{prefix}_paydb"),
    }
    manage(["migrate", "--no-input", "-v", "0"], urls, role="lockserver")
    manage(["migrate", "--no-input", "-v", "0"], urls, role="admin")
    return start_stack(prefix, extra_env=urls | (env or {}))


@pytest.fixture(scope="module")
def stack(cluster):
    live = stack_on(cluster, "restart")
    live.start_admin()
    yield live
    stop_stack(live)


# Short rail timeouts (as the rail tests use), so an outage outlasts both the rail-proxy's nginx
# read timeout (queue 0.5 + connect 0.5 + read 1.5 + margin 0.25 = 2.75 s) and connect + read +
# sweep margin (2.5 s) within the recording's retry (5 s); the sweeper looks every 0.3 s.
SHORT_RAIL_ENV = {
    "RAIL_CONNECT_TIMEOUT_MS": "500",
    "RAIL_READ_TIMEOUT_MS": "1500",
    "RAIL_SWEEP_MARGIN_MS": "500",
    "RAIL_SWEEP_INTERVAL_MS": "300",
    "RAIL_RECORD_RETRY_MS": "5000",
}


@pytest.fixture(scope="module")
def short_rail_stack(cluster):
    live = stack_on(cluster, "restart_short", SHORT_RAIL_ENV)
    yield live
    stop_stack(live)


class Calls:
    """One real call per role that reads or writes its database; each returns the status."""

    def __init__(self, stack: LiveStack, rail: Rail, admin: requests.Session) -> None:
        self.stack = stack
        self.rail = rail
        self.admin = admin
        seeded = rail.claimed_payout(token=1)
        self.payout_id = seeded.payout_id
        self.account_id = seeded.account_id
        self.token = 1000

    def lockserver(self) -> int:
        body = {"ownerId": f"w-{uuid.uuid4().hex[:8]}", "ttlMillis": 10_000}
        url = f"{self.stack.url('lockserver')}/v1/sessions"
        return requests.post(url, json=body, timeout=TIMEOUT).status_code

    def payments(self) -> int:
        url = f"{self.stack.url('payments')}/v1/payouts/{self.payout_id}"
        return requests.get(url, timeout=TIMEOUT).status_code

    def railproxy(self) -> int:
        """A fresh CLAIMED payout submitted: admission, the rail call and its recording."""
        self.token += 1
        payout = self.rail.claimed_payout(token=self.token)
        return self.rail.submit(payout).status_code

    def admin_page(self) -> int:
        url = f"{self.stack.url('admin')}/admin/payments/payout/"
        return self.admin.get(url, timeout=TIMEOUT, allow_redirects=False).status_code

    def every_role(self) -> dict[str, Callable[[], int]]:
        return {
            "lock-server": self.lockserver,
            "payment-resource": self.payments,
            "rail-proxy": self.railproxy,
            "admin": self.admin_page,
        }


@pytest.fixture(scope="module")
def calls(stack):
    rail = Rail(stack)
    rail.stub_config()  # a well-behaved, fast rail
    user, password = f"oncall-{uuid.uuid4().hex[:6]}", f"Restart-proof-{uuid.uuid4().hex}"
    make_staff(stack.env, user, password)
    session = csrf_session(stack.url("admin"))
    assert log_in(session, stack.url("admin"), user, password).status_code == 302
    return Calls(stack, rail, session)


def fill_pools(calls: Calls, per_role: int = 16, overloaded_retries: int = 6) -> None:
    """Concurrent calls on every role, so each role's pools hold several idle connections.

    The database is up here, so a 503 is the role shedding load (OVERLOADED: a request that
    queued past SERVER_QUEUE_DEADLINE_MS, or no pool slot in time), which C3 makes retrySafe
    with retryAfterMillis 500: the warm-up retries it as a client does. It failed a CI run
    once (the admin's page, 16 at once on two busy cores); any other non-2xx still fails."""
    errors: list[str] = []

    def hammer(name: str, call: Callable[[], int]) -> None:
        status = call()
        for _ in range(overloaded_retries):
            if status != 503:
                break
            time.sleep(0.5)
            status = call()
        if status >= 300:
            errors.append(f"{name}: {status}")

    threads = [
        threading.Thread(target=hammer, args=(name, call))
        for name, call in calls.every_role().items()
        for _ in range(per_role)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors


def quarantined(rail: Rail) -> list[tuple]:
    return rail.pay("SELECT payout_id FROM payout WHERE state = 'RAIL_AMBIGUOUS'")


def test_after_a_restart_under_load_the_next_calls_of_every_role_succeed(stack, cluster, calls):
    fill_pools(calls)
    # Callers on every role keep calling through the restart; a call that began while the
    # server was going down may fail, every call that began after it was back must not.
    restarted = threading.Event()
    stop = threading.Event()
    after: dict[str, list[int | str]] = {name: [] for name in calls.every_role()}

    def load(name: str, call: Callable[[], int]) -> None:
        while not stop.is_set():
            began_after = restarted.is_set()
            try:
                status: int | str = call()
            except Exception as exc:  # the test's own SQL fails too while it is down
                status = f"{type(exc).__name__}: {exc}"
            if began_after:
                after[name].append(status)

    loaders = [
        threading.Thread(target=load, args=(name, call))
        for name, call in calls.every_role().items()
    ]
    for thread in loaders:
        thread.start()
    # Calls in flight on every role first, so the restart lands under load.
    Rail.wait_for(lambda: calls.rail.pay("SELECT count(*) FROM rail_submission")[0][0] > 16)
    cluster.restart("fast")
    restarted.set()
    Rail.wait_for(lambda: all(len(got) >= CALLS_AFTER_RESTART for got in after.values()), 60)
    stop.set()
    for thread in loaders:
        thread.join()

    failed = {name: [s for s in got if s not in (200, 201)] for name, got in after.items()}
    assert not any(failed.values()), after
    assert quarantined(calls.rail) == []


def test_a_rail_answer_that_arrives_while_paydb_is_down_is_recorded_when_it_is_back(
    stack, cluster, calls
):
    rail = calls.rail
    rail.stub_config(latency_ms=1_500)  # the answer comes back while paydb is stopped
    calls.token += 1
    payout = rail.claimed_payout(token=calls.token)
    answer: list[requests.Response] = []
    submitter = threading.Thread(target=lambda: answer.append(rail.submit(payout)))
    submitter.start()
    try:
        rail.wait_for(lambda: rail.payout_state(payout.payout_id) == "SUBMITTING")
        cluster.stop("fast")
        log = stack.procs["railproxy"].logfile
        retry = re.compile(r'"event": ?"rail_outcome_record_retry".*' + payout.payout_id)
        Rail.wait_for(lambda: retry.search(log.read_text(errors="replace")) is not None, 15)
    finally:
        cluster.start()
        submitter.join(TIMEOUT)
        rail.stub_config()

    assert answer and answer[0].status_code == 200, answer and answer[0].text
    assert answer[0].json()["outcome"] == "ACKED"
    assert rail.payout_state(payout.payout_id) == "RAIL_ACKED"
    assert [s[0] for s in rail.submissions(payout.payout_id)] == ["ACKED"]
    assert len(rail.transfers(payout.payout_id)) == 1
    assert quarantined(rail) == []


def test_an_answer_recorded_after_the_callers_read_and_the_sweep_threshold_is_not_quarantined(
    short_rail_stack, cluster
):
    """paydb stays down past the rail-proxy's nginx read timeout and past connect + read +
    sweep margin: the caller gets 504 UPSTREAM_TIMEOUT (sent, outcome unknown: the executor
    emits `rail_ambiguous` and stops, C3 §3.7, and the next holder posts the RAIL_ACKED payout),
    and the sweeper, which runs as soon as paydb is back, leaves the intent to the recorder that
    is still retrying. Before the sweep's threshold counted RAIL_RECORD_RETRY_MS, it quarantined
    a payout whose rail answer was known."""
    rail = Rail(short_rail_stack)
    rail.stub_config(latency_ms=1_000)
    payout = rail.claimed_payout(token=7)
    answer: list[requests.Response] = []
    submitter = threading.Thread(target=lambda: answer.append(rail.submit(payout)))
    submitter.start()
    old_threshold_s = (500 + 1_500 + 500) / 1000  # connect + read + sweep margin
    try:
        rail.wait_for(lambda: rail.payout_state(payout.payout_id) == "SUBMITTING")
        admitted = time.monotonic()
        cluster.stop("fast")
        # The rail answered (raildb is on the suite's server) while paydb is down, the
        # caller's read ran out at the proxy (nginx answered it), and the intent is older than
        # the old threshold when paydb comes back.
        Rail.wait_for(lambda: len(rail.transfers(payout.payout_id)) == 1, TIMEOUT)
        submitter.join(TIMEOUT)
        time.sleep(max(0.0, admitted + old_threshold_s + 0.5 - time.monotonic()))
    finally:
        cluster.start()
        rail.stub_config()
    assert answer and answer[0].status_code == 504, answer and answer[0].text
    assert answer[0].json()["code"] == "UPSTREAM_TIMEOUT"

    # The recorder or the sweeper resolves the intent; only the recorder may.
    Rail.wait_for(lambda: rail.payout_state(payout.payout_id) != "SUBMITTING", TIMEOUT)
    assert rail.payout_state(payout.payout_id) == "RAIL_ACKED"
    assert [s[0] for s in rail.submissions(payout.payout_id)] == ["ACKED"]
    assert len(rail.transfers(payout.payout_id)) == 1
    assert quarantined(rail) == []
