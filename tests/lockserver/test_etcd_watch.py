"""The etcd client's watches on gRPC streams (ARCHITECTURE decision 26): a change wakes the
watcher, a member that is gone or dies under the watch is EtcdUnavailable (never a hang), a
refused member hands the watch to the next, and the stream is cancelled on return (etcd's own
watcher gauge goes back down). Real etcd servers, killed for real."""

from __future__ import annotations

import re
import signal
import threading
import uuid

import pytest
import requests

from devstack.common import free_port
from lockserver.etcd_client import EtcdClient, EtcdUnavailable
from lockserver.etcd_ops import delete, put
from tests.conftest import fresh_etcd

pytestmark = [pytest.mark.etcd]


def _changed_key(client: EtcdClient) -> tuple[str, int]:
    """A key put and then deleted: (key, the revision before its deletion)."""
    key = f"watch/{uuid.uuid4().hex}"
    written = client.txn([], [put(key, "v")])
    client.txn([], [delete(key)])
    return key, written.revision


def _watchers(url: str) -> int:
    """etcd's own count of its open watchers (its /metrics)."""
    text = requests.get(f"{url}/metrics", timeout=5).text
    found = re.search(r"^etcd_debugging_mvcc_watcher_total (\d+)", text, re.M)
    assert found, "etcd reports no watcher gauge"
    return int(found.group(1))


def _until(predicate, what: str, attempts: int = 200) -> None:
    stop = threading.Event()
    for _ in range(attempts):
        if predicate():
            return
        stop.wait(0.05)
    raise AssertionError(f"never: {what}")


def test_a_deletion_after_the_revision_wakes_the_watch(etcd_server):
    client = EtcdClient(etcd_server.url)
    try:
        key, before = _changed_key(client)
        # no wall clock: the deletion is replayed from before + 1, so the watch returns on it
        assert client.wait_for_change([key], after_revision=before, timeout_s=3600)
        seen = next(client.deletions([key], after_revision=before, idle_timeout_s=3600))
        assert seen[0] > before and seen[1] is not None and seen[1].key == key
    finally:
        client.close()


def test_a_member_that_refuses_is_etcd_unavailable_not_a_hang():
    client = EtcdClient(f"http://127.0.0.1:{free_port()}")  # nothing listens there
    try:
        with pytest.raises(EtcdUnavailable):
            client.wait_for_change(["k"], after_revision=1, timeout_s=3600)
        with pytest.raises(EtcdUnavailable):
            next(client.deletions(["k/"], after_revision=1, idle_timeout_s=3600))
    finally:
        client.close()


def test_a_refused_member_hands_the_watch_to_the_next(etcd_server):
    dead = f"http://127.0.0.1:{free_port()}"
    client = EtcdClient(f"{dead},{etcd_server.url}")
    try:
        key, before = _changed_key(client)
        client.member_index = 0  # the dead member first
        assert client.wait_for_change([key], after_revision=before, timeout_s=3600)
        assert client.url == etcd_server.url
    finally:
        client.close()


def test_a_member_that_dies_mid_stream_is_etcd_unavailable_not_a_hang():
    member = fresh_etcd()
    client = EtcdClient(member.url)
    outcome: list[object] = []
    try:
        baseline = _watchers(member.url)
        revision = client.txn([], [put("w/k", "v")]).revision

        def watch() -> None:
            try:
                outcome.append(
                    client.wait_for_change(["w/never"], after_revision=revision, timeout_s=3600)
                )
            except EtcdUnavailable as exc:
                outcome.append(exc)

        thread = threading.Thread(target=watch, daemon=True)
        thread.start()
        _until(lambda: _watchers(member.url) > baseline, "the watch was created")
        member.process.send_signal(signal.SIGKILL)
        member.process.wait(10)
        thread.join(30)
        assert not thread.is_alive(), "the watch hangs on a dead member"
        assert len(outcome) == 1 and isinstance(outcome[0], EtcdUnavailable), outcome
    finally:
        client.close()
        member.stop()


def test_the_watch_is_cancelled_when_the_change_is_seen():
    member = fresh_etcd()
    client = EtcdClient(member.url)
    try:
        baseline = _watchers(member.url)
        key, before = _changed_key(client)
        assert client.wait_for_change([key, "w/other"], after_revision=before, timeout_s=3600)
        _until(lambda: _watchers(member.url) == baseline, "etcd dropped the two watchers")
        assert not client.wait_for_change(["w/other"], after_revision=before + 5, timeout_s=0.3)
        _until(lambda: _watchers(member.url) == baseline, "the timed-out watch was dropped")
        seen = list(client.deletions(["w/"], after_revision=before + 5, idle_timeout_s=0.3))
        assert seen == [(before + 5, None)]  # idle: the stream ended, to be reopened
        _until(lambda: _watchers(member.url) == baseline, "the idle deletions watch was dropped")
    finally:
        client.close()
        member.stop()
