"""etcd-specific: token continuity across stores (the floor/offset) and an etcd outage.

Uses private etcd servers (devstack.EtcdServer), never the shared one, because these
tests stop them or need a store with no history.
"""

from __future__ import annotations

import shutil
import subprocess
import uuid

import pytest

from devstack.common import free_port, wait_until
from devstack.etcd import EtcdServer
from dlock.errors import ApiError, Code
from lockserver.backends.etcd.backend import EtcdLockBackend
from lockserver.backends.etcd.tokens import TokenFloorError
from lockserver.etcd_client import EtcdClient, EtcdUnavailable
from tests.conftest import fresh_etcd

pytestmark = pytest.mark.etcd


def backend_on(server: EtcdServer, **kwargs) -> EtcdLockBackend:
    return EtcdLockBackend(
        url=server.url, prefix="dlock/", adopt_pg_sequence=False, housekeeping=False, **kwargs
    )


def grant_and_release(backend: EtcdLockBackend, count: int = 1) -> list[int]:
    session = backend.open_session(owner_id="w", ttl_ms=10_000)
    tokens = []
    for _ in range(count):
        key = f"k-{uuid.uuid4().hex[:8]}"
        grant = backend.acquire(
            key=key, session_id=session.session_id, owner_id=None, ttl_ms=5_000, wait_ms=0
        )
        backend.release(key=key, session_id=session.session_id, token=grant.fencing_token)
        tokens.append(grant.fencing_token)
    return tokens


def test_a_fresh_etcd_with_the_old_highest_token_as_floor_keeps_tokens_increasing(own_etcd):
    old = backend_on(own_etcd)
    issued = grant_and_release(old, 20)
    highest = max(issued)
    fresh = fresh_etcd()
    try:
        naive = backend_on(fresh, token_floor=0, ensure_floor=False)
        naive_next = naive.next_token_lower_bound()
        assert naive_next < highest  # the hazard: a fresh store would restart near 1
        switched = backend_on(fresh, token_floor=highest)
        first = grant_and_release(switched, 3)
        assert min(first) > highest and first == sorted(first)
        # the offset is persisted: a replica started later without the floor keeps it
        later = backend_on(fresh, token_floor=0)
        assert min(grant_and_release(later)) > max(first)
    finally:
        fresh.stop()


def test_raising_the_floor_later_never_changes_a_live_grants_token(own_etcd):
    backend = backend_on(own_etcd)
    session = backend.open_session(owner_id="holder", ttl_ms=10_000)
    grant = backend.acquire(
        key="held-across-raise",
        session_id=session.session_id,
        owner_id=None,
        ttl_ms=10_000,
        wait_ms=0,
    )
    raised = backend_on(own_etcd, token_floor=grant.fencing_token + 1_000_000)
    info = raised.inspect(key="held-across-raise")
    assert info.fencing_token == grant.fencing_token
    renewed = raised.renew(
        key="held-across-raise",
        session_id=session.session_id,
        token=grant.fencing_token,
        ttl_ms=5_000,
    )
    assert renewed.fencing_token == grant.fencing_token
    raised.release(
        key="held-across-raise", session_id=session.session_id, token=grant.fencing_token
    )
    assert min(grant_and_release(raised)) > grant.fencing_token + 1_000_000


def test_a_floor_beyond_int64_is_refused(own_etcd):
    with pytest.raises(TokenFloorError):
        backend_on(own_etcd, token_floor=2**62)


def test_etcd_down_answers_not_leader_quickly_and_recovers_without_a_new_backend(own_etcd):
    backend = backend_on(own_etcd)
    session = backend.open_session(owner_id="survivor", ttl_ms=30_000)
    before = grant_and_release(backend)
    own_etcd.stop()
    for call in (
        lambda: backend.open_session(owner_id="w", ttl_ms=5_000),
        lambda: backend.heartbeat(session_id=session.session_id, owner_id="survivor"),
        lambda: backend.acquire(
            key="k", session_id=session.session_id, owner_id=None, ttl_ms=5_000, wait_ms=2_000
        ),
        lambda: backend.inspect(key="k"),
    ):
        with pytest.raises(ApiError) as caught:
            call()
        assert caught.value.code == Code.NOT_LEADER and caught.value.status == 503
        assert caught.value.retry_after_ms > 0
    with pytest.raises(EtcdUnavailable):
        backend.check_ready()
    own_etcd.start()  # same data directory and ports
    backend.check_ready()
    after = grant_and_release(backend)
    assert min(after) > max(before)
    # the session survived the outage only if its lease did: either answer is a typed code
    try:
        backend.heartbeat(session_id=session.session_id, owner_id="survivor")
    except ApiError as exc:
        assert exc.code == Code.SESSION_EXPIRED


def test_a_backend_built_while_etcd_is_down_checks_the_floor_on_first_use(own_etcd):
    own_etcd.stop()
    backend = backend_on(own_etcd, token_floor=10_000_000)  # returns: no hang at start-up
    with pytest.raises(ApiError) as caught:
        backend.open_session(owner_id="w", ttl_ms=5_000)
    assert caught.value.code == Code.NOT_LEADER
    own_etcd.start()
    assert min(grant_and_release(backend)) > 10_000_000


def has_leader(url: str) -> bool:
    try:
        return EtcdClient(url, read_timeout=1.0).has_leader()
    except EtcdUnavailable:
        return False


def test_a_member_without_a_leader_answers_not_leader_within_the_request_timeout(tmp_path):
    """Two members, one stopped: the survivor has no quorum, hence no leader."""
    ports = {name: (free_port(), free_port()) for name in ("a", "b")}
    cluster = ",".join(f"{n}=http://127.0.0.1:{peer}" for n, (_, peer) in ports.items())
    members = {}
    for name, (client, peer) in ports.items():
        members[name] = subprocess.Popen(
            [
                shutil.which("etcd") or "/usr/bin/etcd",
                *("--name", name, "--data-dir", str(tmp_path / name)),
                *("--heartbeat-interval", "50", "--election-timeout", "500"),
                *("--listen-client-urls", f"http://127.0.0.1:{client}"),
                *("--advertise-client-urls", f"http://127.0.0.1:{client}"),
                *("--listen-peer-urls", f"http://127.0.0.1:{peer}"),
                *("--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}"),
                *("--initial-cluster", cluster, "--log-level", "error"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    url = f"http://127.0.0.1:{ports['a'][0]}"
    try:
        wait_until(lambda: has_leader(url), timeout=20, what="a 2-member cluster's leader")
        backend = EtcdLockBackend(
            url=url, prefix="dlock/", adopt_pg_sequence=False, housekeeping=False
        )
        session = backend.open_session(owner_id="w", ttl_ms=10_000)
        members["b"].terminate()
        members["b"].wait(10)
        wait_until(lambda: not has_leader(url), timeout=20, what="the leader to be lost")
        backend.client.timeout = (0.5, 1.0)  # the request timeout bounds every answer
        with pytest.raises(EtcdUnavailable):
            backend.check_ready()
        for call in (
            lambda: backend.open_session(owner_id="w", ttl_ms=5_000),
            lambda: backend.acquire(
                key="k", session_id=session.session_id, owner_id=None, ttl_ms=5_000, wait_ms=0
            ),
        ):
            with pytest.raises(ApiError) as caught:
                call()
            assert caught.value.code == Code.NOT_LEADER
        backend.close()
    finally:
        for proc in members.values():
            if proc.poll() is None:
                proc.terminate()
                proc.wait(10)
