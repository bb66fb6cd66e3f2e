"""The same client, unchanged, against the lock server on its etcd backend (FR-09)."""

from __future__ import annotations

import uuid

import pytest

from devstack.common import wait_until
from dlock.client import LockClient, LockContended, LockLost, RetryPolicy
from tests.lockserver.conftest import start_lock_server

pytestmark = [pytest.mark.live, pytest.mark.etcd]


@pytest.fixture(scope="module")
def etcd_lock_url(etcd_server):
    server = start_lock_server("etcd", {"ETCD_URL": etcd_server.url})
    yield server.proc.url
    server.stop()


def test_grants_contention_renew_and_release_behave_alike_on_etcd(etcd_lock_url):
    key = f"payout:acct-{uuid.uuid4().hex[:10]}"
    holder = LockClient(etcd_lock_url, "etcd-holder")
    waiter = LockClient(etcd_lock_url, "etcd-waiter", retry=RetryPolicy(max_retries=1))
    entered = False
    with holder.session(5_000) as session:
        with session.lock(key, 3_000) as first:
            with waiter.session(5_000) as other:
                with pytest.raises(LockContended):
                    with other.lock(key, 3_000):
                        entered = True
            first.renew()
            first.ensure_valid()
        with session.lock(key, 3_000) as second:
            assert second.token > first.token
    assert not entered


def test_a_lease_taken_over_on_etcd_is_lock_lost_on_renew(etcd_lock_url):
    key = f"payout:acct-{uuid.uuid4().hex[:10]}"
    slow = LockClient(etcd_lock_url, "etcd-slow")
    fast = LockClient(etcd_lock_url, "etcd-fast")
    with slow.session(10_000) as session:
        grant = session.acquire(key, 1_000)
        wait_until(lambda: not slow.info(key)["held"], timeout=10, what="lease expiry")
        with fast.session(5_000) as other, other.lock(key, 5_000) as newer:
            with pytest.raises(LockLost):
                grant.renew()
            assert newer.token > grant.token
