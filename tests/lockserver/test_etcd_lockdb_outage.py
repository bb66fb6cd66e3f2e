"""An etcd-backed lock-server while its lockdb is down (issue 27 item 3): etcd holds sessions,
grants and each session's credential, lockdb only backs the token reservation. So while
PostgreSQL is stopped the lock-server stays ready (lockdb DEGRADED) and keeps opening sessions,
granting, renewing and releasing with increasing tokens — until the reserved tokens are used
up; then acquires answer 503 NOT_LEADER and readiness goes DOWN, and both recover, in the same
process, when lockdb is back. Real etcd, a real PostgreSQL cluster of the test's own (stopped
with `-m immediate`, as a crash), real lock-server processes."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path

import pytest
import requests

from devstack.common import free_port
from devstack.postgres import PgCluster, private_datadir
from devstack.roles import RoleProcess, manage
from dlock.auth import credentials_entry, new_credential
from tests.lockserver.conftest import TEST_LIMITS, LockServer, assert_error, new_key

pytestmark = [pytest.mark.etcd, pytest.mark.live]

OTHER = new_credential()  # a second executor credential: sessions stay their opener's


@pytest.fixture
def lockdb(tmp_path):
    cluster = PgCluster(private_datadir(tmp_path, "lockdb"), free_port(), fast=True)
    cluster.start()
    yield cluster
    cluster.stop("immediate")
    shutil.rmtree(cluster.datadir, ignore_errors=True)


def start(lockdb: PgCluster, etcd_url: str, **extra: str) -> LockServer:
    env = {
        "DJANGO_SECRET_KEY": os.environ["DJANGO_SECRET_KEY"],
        "DLOCK_PROOF_KEYS": os.environ["DLOCK_PROOF_KEYS"],
        "DLOCK_CREDENTIALS": os.environ["DLOCK_CREDENTIALS"]
        + ","
        + credentials_entry(OTHER, "executor"),
        "DJANGO_DEBUG": "false",
        "LOCK_BACKEND": "etcd",
        "ETCD_URL": etcd_url,
        "ETCD_PREFIX": f"t{uuid.uuid4().hex[:8]}/",
        "LOCK_DATABASE_URL": lockdb.create_database("lockdb"),
        **TEST_LIMITS,
        **extra,
    }
    manage(["migrate", "--no-input", "-v", "0"], env, role="lockserver")
    logdir = Path(tempfile.mkdtemp(prefix="dlock-lockdb-outage-"))
    proc = RoleProcess("lockserver", free_port(), env, logdir / "lockserver.log").start()
    return LockServer(backend="etcd", env=env, proc=proc)


def readiness(server: LockServer) -> tuple[int, dict]:
    response = server.get("/health/ready")
    body = response.json()
    return response.status_code, body.get("checks") or body["details"]["checks"]


def _answers(server: LockServer, path: str) -> bool:
    try:
        return server.get(path, timeout=2).status_code == 200
    except requests.RequestException:
        return False


def until(predicate, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def pair(server: LockServer, session: dict) -> int:
    key = new_key()
    response = server.acquire(key, session)
    assert response.status_code == 200, response.text
    token = response.json()["fencingToken"]
    assert server.renew(key, session, token).status_code == 200
    assert server.release(key, session, token).status_code == 204
    return token


def test_with_lockdb_stopped_it_stays_ready_and_serves_sessions_and_grants(lockdb, own_etcd):
    server = start(lockdb, own_etcd.url)
    try:
        pid = server.proc.process.pid
        before = server.session(ttl_ms=30_000)
        first = pair(server, before)
        assert readiness(server) == (200, {"lockdb": "UP", "lockBackend": "UP"})

        lockdb.stop("immediate")  # a crash: nothing is shut down cleanly
        code, checks = readiness(server)
        assert (code, checks) == (200, {"lockdb": "DEGRADED", "lockBackend": "UP"})

        # L1 works without lockdb (the credential is in the session's etcd record) …
        during = server.session(ttl_ms=30_000)
        beat = server.post(
            f"/v1/sessions/{during['sessionId']}/heartbeat",
            headers={"X-Owner-Id": during["ownerId"]},
        )
        assert beat.status_code == 200, beat.text
        # … and so do L4-L6 on both sessions, tokens still increasing.
        tokens = [pair(server, before), pair(server, during), pair(server, before)]
        assert tokens == sorted(tokens) and tokens[0] > first
        # Ownership is still enforced: another credential may not use the session.
        foreign = server.post(
            f"/v1/locks/{new_key()}/acquire",
            {"sessionId": during["sessionId"]},
            headers={"X-Owner-Id": during["ownerId"], "Authorization": f"Bearer {OTHER}"},
        )
        assert_error(foreign, 403, "FORBIDDEN")

        # A fresh process (another replica: nothing kept in memory) judges ownership from the
        # session's etcd record alone while lockdb is down.
        server.http.close()
        server.proc.stop()
        server.proc.start(wait=False)
        until(lambda: _answers(server, "/health/live"), "the new process to answer")
        beat_path = f"/v1/sessions/{during['sessionId']}/heartbeat"
        owner = {"X-Owner-Id": during["ownerId"]}
        assert server.post(beat_path, headers=owner).status_code == 200
        other = {**owner, "Authorization": f"Bearer {OTHER}"}
        assert_error(server.post(beat_path, headers=other), 403, "FORBIDDEN")
        pid = server.proc.process.pid

        lockdb.start()
        until(lambda: readiness(server)[1]["lockdb"] == "UP", "lockdb UP again")
        assert pair(server, during) > tokens[-1]
        assert server.proc.process.pid == pid and server.proc.process.poll() is None
    finally:
        server.stop()


def test_it_goes_unready_only_when_the_reserved_tokens_are_used_up(lockdb, own_etcd):
    # A block of 40: at least 20 tokens (etcd revisions) reserved ahead of need.
    server = start(lockdb, own_etcd.url, LOCK_TOKEN_RESERVE_BLOCK="40")
    try:
        session = server.session(ttl_ms=30_000)
        issued = [pair(server, session)]
        lockdb.stop("immediate")
        assert readiness(server)[0] == 200
        refused = None
        for _ in range(40):  # each pair advances etcd's revision by 3 (grant, renew, release)
            key = new_key()
            response = server.acquire(key, session)
            if response.status_code != 200:
                refused = response
                break
            token = response.json()["fencingToken"]
            issued.append(token)
            assert server.release(key, session, token).status_code == 204
        assert refused is not None, "a block of 40 cannot cover 40 grants"
        assert_error(refused, 503, "NOT_LEADER")
        assert len(issued) >= 1 + 20 // 3  # served on the reserve first
        code, checks = readiness(server)
        assert code == 503 and checks["lockdb"] == "DOWN", checks
        # The refused grant was withdrawn, not left behind.
        assert server.get(f"/v1/locks/{key}").json()["held"] is False

        lockdb.start()
        until(lambda: readiness(server)[0] == 200, "ready again")
        after = pair(server, session)
        assert after > max(issued) and issued == sorted(issued)
    finally:
        server.stop()
