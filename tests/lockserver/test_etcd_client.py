"""The etcd client's channels and failover (ARCHITECTURE decisions 21 and 26): a channel per
member, made by the process that calls (a forked worker makes its own), and a write that may
have reached a member is never sent to another one, while a read is. The member that fails
after receiving a call is a gRPC server speaking etcd's KV service from the generated stubs (it
records what it got, then fails the call as a member dying under it would); the other member
is a real etcd."""

from __future__ import annotations

import os
import uuid
from concurrent import futures

import grpc
import pytest

from devstack.common import free_port
from lockserver import etcd_client
from lockserver.etcd_client import EtcdClient, EtcdUnavailable
from lockserver.etcd_ops import compare, get, put
from lockserver.etcd_proto import rpc_pb2_grpc

pytestmark = [pytest.mark.etcd]


class _FailsAfterReceiving(rpc_pb2_grpc.KVServicer):
    """Takes every call, then fails it with UNAVAILABLE: the request reached the member."""

    def __init__(self) -> None:
        self.received: list[str] = []

    def Txn(self, request, context):  # etcd's method names
        self.received.append("Txn")
        context.abort(grpc.StatusCode.UNAVAILABLE, "transport is closing")

    def Range(self, request, context):
        self.received.append("Range")
        context.abort(grpc.StatusCode.UNAVAILABLE, "transport is closing")


class _ProposalOutOfTime(rpc_pb2_grpc.LeaseServicer):
    """Answers LeaseGrant as a member without a leader did once: UNKNOWN, "context deadline
    exceeded" (the proposal's context ran out; whether it will apply is unknown)."""

    def LeaseGrant(self, request, context):
        context.abort(grpc.StatusCode.UNKNOWN, "context deadline exceeded")


@pytest.fixture
def failing_member():
    servicer = _FailsAfterReceiving()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    rpc_pb2_grpc.add_KVServicer_to_server(servicer, server)
    port = free_port()
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    yield f"http://127.0.0.1:{port}", servicer
    server.stop(0)


def test_a_write_that_reached_a_member_is_never_sent_to_another(failing_member, etcd_server):
    url, member = failing_member
    client = EtcdClient(f"{url},{etcd_server.url}")
    key = f"client/{uuid.uuid4().hex}"
    try:
        with pytest.raises(EtcdUnavailable):
            client.txn([compare(key, "CREATE", "EQUAL", 0)], [put(key, "once")])
        assert member.received == ["Txn"]
        # not re-sent: the healthy member never saw it
        assert client.url == etcd_server.url  # the next call goes to the next member
        assert client.range(key).first() is None
        written = client.txn([compare(key, "CREATE", "EQUAL", 0)], [put(key, "next call")])
        assert written.succeeded and member.received == ["Txn"]
    finally:
        client.close()


def test_a_read_that_failed_on_a_member_is_asked_of_the_next(failing_member, etcd_server):
    url, member = failing_member
    client = EtcdClient(f"{url},{etcd_server.url}")
    key = f"client/{uuid.uuid4().hex}"
    try:
        EtcdClient(etcd_server.url).txn([], [put(key, "there")])
        assert client.range(key).first().value == b"there"
        assert client.read(get(key)).responses[0].first().value == b"there"
        assert member.received == ["Range"]  # asked once, then the next member answered
    finally:
        client.close()


def test_a_channel_is_made_by_the_process_that_calls_and_never_inherited(etcd_server, monkeypatch):
    made: list[str] = []
    real_channel, real_pid = grpc.insecure_channel, os.getpid()

    def counted(target, *args, **kwargs):
        made.append(target)
        return real_channel(target, *args, **kwargs)

    monkeypatch.setattr(etcd_client.grpc, "insecure_channel", counted)
    client = EtcdClient(etcd_server.url)
    try:
        assert made == []  # nothing at construction (a gunicorn master builds no channel)
        client.range("client/k")
        client.range("client/k")
        assert len(made) == 1  # one channel per member, kept
        monkeypatch.setattr(etcd_client.os, "getpid", lambda: real_pid + 1)  # a forked worker
        client.range("client/k")
        assert len(made) == 2  # its own channel, not the parent's
    finally:
        client.close()


def test_a_proposal_whose_context_ran_out_is_unavailability_not_an_error():
    """Then the lock server answers 503 NOT_LEADER (retrySafe), not a 500: a CI run's acquire
    on a member without a leader raised EtcdError from a LeaseGrant answered this way."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    rpc_pb2_grpc.add_LeaseServicer_to_server(_ProposalOutOfTime(), server)
    port = free_port()
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    client = EtcdClient(f"http://127.0.0.1:{port}")
    try:
        with pytest.raises(EtcdUnavailable, match="context deadline exceeded"):
            client.lease_grant(5)
    finally:
        client.close()
        server.stop(0)
