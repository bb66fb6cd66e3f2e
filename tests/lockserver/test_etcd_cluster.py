"""ETCD_URL is a list of members (issue 16 item 1, ARCHITECTURE decision 16): with a 3-member
etcd cluster started here and the member the lock server talks to killed, it moves to a healthy
member within one hop budget and keeps serving acquires."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import requests

from devstack.common import free_port
from tests.lockserver.conftest import new_key, start_lock_server
from tests.loopback import LoopbackServer

pytestmark = [pytest.mark.etcd, pytest.mark.live]


def start_cluster(size: int = 3) -> tuple[list[subprocess.Popen], list[str], Path]:
    binary = shutil.which("etcd") or "/usr/bin/etcd"
    work = Path(tempfile.mkdtemp(prefix="dlock-etcd3-"))
    members = [(f"m{i}", free_port(), free_port()) for i in range(size)]
    cluster = ",".join(f"{name}=http://127.0.0.1:{peer}" for name, _, peer in members)
    procs = []
    for name, client, peer in members:
        log = open(work / f"{name}.log", "ab")
        procs.append(
            subprocess.Popen(
                [
                    binary,
                    "--name",
                    name,
                    "--data-dir",
                    str(work / name),
                    "--listen-client-urls",
                    f"http://127.0.0.1:{client}",
                    "--advertise-client-urls",
                    f"http://127.0.0.1:{client}",
                    "--listen-peer-urls",
                    f"http://127.0.0.1:{peer}",
                    "--initial-advertise-peer-urls",
                    f"http://127.0.0.1:{peer}",
                    "--initial-cluster",
                    cluster,
                    "--initial-cluster-state",
                    "new",
                    "--heartbeat-interval",
                    "50",
                    "--election-timeout",
                    "500",
                    "--log-level",
                    "warn",
                ],  # fmt: skip
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ},
            )
        )
    urls = [f"http://127.0.0.1:{client}" for _, client, _ in members]
    deadline = time.monotonic() + 30
    while True:
        try:
            status = requests.post(f"{urls[0]}/v3/maintenance/status", json={}, timeout=1).json()
            if str(status.get("leader", "0")) != "0":
                break
        except requests.RequestException:
            pass
        assert time.monotonic() < deadline, "the 3-member etcd cluster never elected a leader"
        time.sleep(0.2)
    return procs, urls, work


def test_the_lock_server_keeps_serving_acquires_when_its_etcd_member_is_killed():
    procs, urls, work = start_cluster()
    server = start_lock_server("etcd", {"ETCD_URL": ",".join(urls)})
    try:
        session = server.session(ttl_ms=30_000)
        before = [server.acquire(new_key(), session).json()["fencingToken"] for _ in range(3)]
        os.killpg(procs[0].pid, signal.SIGKILL)  # the first member: the one it talks to
        procs[0].wait(10)
        recovered_at = None
        started = time.monotonic()
        while time.monotonic() - started < 10:
            response = server.acquire(new_key(), session)
            if response.status_code == 200:
                recovered_at = time.monotonic() - started
                break
            assert response.status_code == 503 and response.json()["code"] == "NOT_LEADER"
            time.sleep(0.1)
        assert recovered_at is not None and recovered_at < 5, recovered_at
        after = []
        for _ in range(10):
            response = server.acquire(new_key(), session)
            assert response.status_code == 200, response.text
            after.append(response.json()["fencingToken"])
        assert min(after) > max(before) and after == sorted(after)
        assert server.get("/health/ready").status_code == 200
        print(f"acquires served again {recovered_at:.2f} s after the member was killed")
    finally:
        server.stop()
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        shutil.rmtree(work, ignore_errors=True)


def test_every_etcd_call_of_one_request_ends_within_the_request_deadline():
    """An acquire makes several etcd calls; each alone fits one hop budget, but their sum did
    not, so on a stalled member the client's read timeout fired first (ServiceUnreachable after
    sending, where 503 NOT_LEADER was coming). Inside one `request_deadline` the first call uses
    the budget up and the following ones are refused without being sent."""
    from lockserver.etcd_client import EtcdClient, EtcdUnavailable, request_deadline

    hole = LoopbackServer()  # a member that accepts connections and never answers (stalled)
    client = EtcdClient(hole.url, connect_timeout=0.5, read_timeout=0.4)
    try:
        with request_deadline(0.3):
            with pytest.raises(EtcdUnavailable):
                client.range("k")  # the stalled member takes the request's whole budget
            for _ in range(3):
                with pytest.raises(EtcdUnavailable, match="budget is spent; nothing was sent"):
                    client.range("k")
        # outside a request (housekeeping), each call keeps its own hop budget
        with pytest.raises(EtcdUnavailable):
            client.range("k")
    finally:
        client.close()
        hole.close()


def test_a_store_call_shares_one_deadline_with_the_calls_it_makes():
    from lockserver.backends.etcd.common import request_budget_s, store_call
    from lockserver.etcd_client import REQUEST_DEADLINE

    seen: list[float | None] = []

    @store_call
    def inner(**_kwargs):
        seen.append(REQUEST_DEADLINE.get())

    @store_call
    def outer(**kwargs):
        seen.append(REQUEST_DEADLINE.get())
        inner(wait_ms=60_000)  # nested: keeps the caller's deadline, not a fresh, longer one

    outer(wait_ms=1_000)
    assert seen[0] is not None and seen[0] == seen[1]
    assert REQUEST_DEADLINE.get() is None
    assert request_budget_s(1_000) == pytest.approx(request_budget_s() + 1.0)
