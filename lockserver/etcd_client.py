"""The lock server's etcd v3 client: etcd's native gRPC API through grpcio's synchronous API,
with the stubs grpcio-tools generated from etcd's own .proto files (`lockserver.etcd_proto`,
`make etcd-stubs`; ARCHITECTURE decision 26). The request and answer shapes are
`lockserver.etcd_ops`.

- **One channel per member**, made lazily by the process that uses it (a gunicorn worker, after
  the fork; a channel is never inherited across a fork: a process that finds channels made by
  another pid drops them and makes its own). `https://` members are verified against
  DLOCK_CA_BUNDLE (else the system store) and shown DLOCK_CLIENT_CERT / DLOCK_CLIENT_KEY when
  set (etcd's --client-cert-auth), as every dlock client does (`dlock.http`).
- **Deadlines.** Every call is connect + request bounded: the channel must be connected within
  the connect timeout (else nothing was sent), the call answered within the request timeout,
  and all the calls of one lock-server request end by its `request_deadline`.
- **Failover (ARCHITECTURE decisions 21 and 26).** A call moves to the next member only when the
  member provably did nothing with it: its channel did not connect in time, gRPC reports the
  connection failed before the call went out, or etcd refused it before proposing ("no leader",
  "not capable", "stopped"). A write that met anything else (UNAVAILABLE after the request
  left, DEADLINE_EXCEEDED) may have applied: it is EtcdUnavailable, never re-sent; the next
  call goes to the next member. Reads (ranges, status) may be asked again elsewhere.
- **Streams.** Watches and lease keepalives are gRPC streams on the same channels, under the
  same deadlines; a stream is cancelled on every return, which ends its watchers server-side.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc

from dlock.http import ca_bundle, client_certificate
from lockserver.etcd_ops import (
    KeyValue,
    RangeResult,
    RequestOp,
    TxnResult,
    key_bytes,
    key_value,
    range_end,
    range_request,
    range_result,
    txn_result,
    writes,
)
from lockserver.etcd_proto import rpc_pb2, rpc_pb2_grpc

# Texts of an UNAVAILABLE that gRPC gives when the connection failed before the call went out.
_NOT_SENT_TEXT = (
    "failed to connect to all addresses",
    "connection refused",
    "connections to all backends failing",
    "dns resolution failed",
    "name resolution",
    "empty address list",
)
# etcd refused the call before proposing it: nothing applied.
_REFUSED_TEXT = ("no leader", "not capable", "etcdserver: stopped")
# stream RPCs called for one answer (`EtcdClient.call`)
_ONE_MESSAGE_STREAMS = frozenset({"lease.LeaseKeepAlive"})
_UNAVAILABLE_CODES = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}
# A member without a leader may answer a proposal whose context ran out with status UNKNOWN and
# Go's "context deadline exceeded" (seen on a LeaseGrant in a CI run): as unknown as a timeout.
_UNAVAILABLE_TEXT = (
    "timed out",
    "leader changed",
    "too many requests",
    "no leader",
    "deadline exceeded",
)
# a watch on a member that loses its leader is closed by it rather than left silent
_REQUIRE_LEADER = (("hasleader", "true"),)
_CHANNEL_OPTIONS = (
    # connections of this client only: a client's failover and TLS settings are its own
    ("grpc.use_local_subchannel_pool", 1),
    # a member that is back is connected again within about a second, not after minutes
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 2_000),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
)


class EtcdError(Exception):
    """etcd answered with an error that is not about availability (a bug or a bad request)."""

    def __init__(self, message: str, grpc_code: int | None = None) -> None:
        super().__init__(message)
        self.grpc_code = grpc_code


class EtcdUnavailable(EtcdError):
    """Unreachable, timed out, or the member has no leader: nothing can be decided here now."""


# The deadline of the lock-server request being served (monotonic seconds), set once per request
# by `request_deadline`: every etcd call the request makes ends by it, so the sum of a request's
# calls (an acquire makes several) stays inside one hop budget and the client hears 503
# NOT_LEADER before its own read timeout, not a ReadTimeout it cannot tell from a lost reply.
REQUEST_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "etcd_request_deadline", default=None
)


@contextlib.contextmanager
def request_deadline(seconds: float) -> Iterator[None]:
    """Bound every etcd call made inside to end within `seconds` from now (the outermost
    deadline wins: a store call made by another one keeps its caller's)."""
    if REQUEST_DEADLINE.get() is not None:
        yield
        return
    token = REQUEST_DEADLINE.set(time.monotonic() + seconds)
    try:
        yield
    finally:
        REQUEST_DEADLINE.reset(token)


class _Refused(Exception):
    """A member provably did nothing with the call: safe to send it to another member."""

    def __init__(self, unavailable: EtcdUnavailable) -> None:
        super().__init__(str(unavailable))
        self.unavailable = unavailable


def _credentials() -> grpc.ChannelCredentials:
    """TLS as every dlock client: DLOCK_CA_BUNDLE (else the system store) and the client
    certificate when this process has one."""
    bundle = ca_bundle() or ssl.get_default_verify_paths().cafile
    roots = Path(bundle).read_bytes() if bundle else None
    client = client_certificate()
    if client is None:
        return grpc.ssl_channel_credentials(root_certificates=roots)
    return grpc.ssl_channel_credentials(
        root_certificates=roots,
        private_key=Path(client[1]).read_bytes(),
        certificate_chain=Path(client[0]).read_bytes(),
    )


class Member:
    """One etcd member: its channel (made on first use in this process) and the stubs on it."""

    def __init__(self, url: str) -> None:
        self.url = url
        scheme, _, rest = url.partition("://")
        self.tls = scheme == "https"
        self.target = rest.split("/", 1)[0]
        self._pid = -1
        self._guard = threading.Lock()
        self._channel: grpc.Channel | None = None
        self._state = grpc.ChannelConnectivity.IDLE
        self._changed = threading.Condition()
        self.kv: rpc_pb2_grpc.KVStub
        self.lease: rpc_pb2_grpc.LeaseStub
        self.watch: rpc_pb2_grpc.WatchStub
        self.maintenance: rpc_pb2_grpc.MaintenanceStub

    def _on_state(self, state: grpc.ChannelConnectivity) -> None:
        with self._changed:
            self._state = state
            self._changed.notify_all()

    def channel(self) -> grpc.Channel:
        if self._channel is not None and self._pid == os.getpid():
            return self._channel
        with self._guard:
            if self._channel is None or self._pid != os.getpid():
                # a channel made by another process (before a fork) is never used here
                if self.tls:
                    channel = grpc.secure_channel(self.target, _credentials(), _CHANNEL_OPTIONS)
                else:
                    channel = grpc.insecure_channel(self.target, _CHANNEL_OPTIONS)
                self._state = grpc.ChannelConnectivity.IDLE
                channel.subscribe(self._on_state, try_to_connect=False)
                self.kv = rpc_pb2_grpc.KVStub(channel)
                self.lease = rpc_pb2_grpc.LeaseStub(channel)
                self.watch = rpc_pb2_grpc.WatchStub(channel)
                self.maintenance = rpc_pb2_grpc.MaintenanceStub(channel)
                self._channel, self._pid = channel, os.getpid()
        return self._channel

    def connect(self, timeout_s: float, *, patient: bool) -> None:
        """Make sure the channel is connected; _Refused (nothing was sent) when it is not
        within `timeout_s` (a member that does not answer). A channel that is failing (refused,
        reset, TLS handshake: gRPC's TRANSIENT_FAILURE, while it backs off before connecting
        again) is refused at once unless `patient` (no other member is left to try): then it
        has `timeout_s` to come back, so a member that restarted serves the next call."""
        channel = self.channel()
        if self._state == grpc.ChannelConnectivity.READY:
            return
        failing = self._state == grpc.ChannelConnectivity.TRANSIENT_FAILURE
        if not failing or patient:
            channel.subscribe(_ignore, try_to_connect=True)  # starts connecting when idle
            channel.unsubscribe(_ignore)
            ends = time.monotonic() + max(0.01, timeout_s)
            with self._changed:
                while self._state != grpc.ChannelConnectivity.READY:
                    if self._state == grpc.ChannelConnectivity.TRANSIENT_FAILURE and not patient:
                        break
                    left = ends - time.monotonic()
                    if left <= 0:
                        break
                    self._changed.wait(left)
        if self._state != grpc.ChannelConnectivity.READY:
            raise _Refused(EtcdUnavailable(f"etcd unreachable: {self.url} is not connected"))

    def close(self) -> None:
        with self._guard:
            if self._channel is not None and self._pid == os.getpid():
                # no connectivity callback left to poll a closed channel (grpc's poller thread)
                self._channel.unsubscribe(self._on_state)
                self._channel.close()
            self._channel = None


def _one_answer(rpc: Any, request: Any, timeout_s: float) -> Any:
    """A stream call with one request: its first answer (None if it ended without one); the
    stream is cancelled on return. etcd answers the request before it sees the end of the send
    side, so the stream ends with the answer."""
    stream = rpc(iter([request]), timeout=timeout_s)
    try:
        return next(stream, None)
    finally:
        stream.cancel()


def _ignore(_state: grpc.ChannelConnectivity) -> None:
    pass


def _status(exc: grpc.RpcError) -> tuple[grpc.StatusCode, str]:
    code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    details = (exc.details() if hasattr(exc, "details") else None) or str(code)
    return code, details


def _mapped(exc: grpc.RpcError, *, may_resend: bool) -> Exception:
    """The EtcdError for a failed call; _Refused when the call may go to another member."""
    code, details = _status(exc)
    lowered = details.lower()
    if code in _UNAVAILABLE_CODES or any(text in lowered for text in _UNAVAILABLE_TEXT):
        unavailable = EtcdUnavailable(f"etcd unavailable: {details}", code.value[0])
        not_sent = code == grpc.StatusCode.UNAVAILABLE and any(
            text in lowered for text in _NOT_SENT_TEXT
        )
        if not_sent or any(text in lowered for text in _REFUSED_TEXT) or may_resend:
            return _Refused(unavailable)
        return unavailable
    return EtcdError(f"etcd error: {details}", code.value[0])


class EtcdClient:
    """Thread-safe: one channel per member, shared by the process's threads for calls and
    streams alike."""

    def __init__(
        self,
        url: str,
        *,
        connect_timeout: float = 0.5,
        read_timeout: float = 2.0,
    ) -> None:
        # ETCD_URL is a comma-separated list of members (ARCHITECTURE decision 16)
        self.urls = [part.strip().rstrip("/") for part in url.split(",") if part.strip()]
        if not self.urls or not all(u.startswith(("http://", "https://")) for u in self.urls):
            raise ValueError(f"ETCD_URL must be http(s) URLs separated by commas, got {url!r}")
        self.members = [Member(u) for u in self.urls]
        self.member_index = 0
        self.timeout = (connect_timeout, read_timeout)

    def close(self) -> None:
        """Close this process's channels to every member."""
        for member in self.members:
            member.close()

    @property
    def url(self) -> str:
        """The member calls go to now; moves on when one refuses or times out."""
        return self.urls[self.member_index % len(self.urls)]

    def _member(self) -> Member:
        return self.members[self.member_index % len(self.members)]

    def _next_member(self, failed: Member) -> None:
        if self._member() is failed:  # another thread may have moved on already
            self.member_index = (self.member_index + 1) % len(self.members)

    def _deadline(self, timeout: tuple[float, float] | None = None) -> float:
        connect, read = timeout or self.timeout
        deadline = time.monotonic() + connect + read
        request_ends = REQUEST_DEADLINE.get()
        if request_ends is not None:
            if request_ends - time.monotonic() <= 0.05:
                raise EtcdUnavailable("the request's etcd budget is spent; nothing was sent")
            deadline = min(deadline, request_ends)
        return deadline

    # -- transport

    def call(
        self,
        method: str,
        request: Any,
        *,
        may_resend: bool = False,
        timeout: tuple[float, float] | None = None,
    ) -> Any:
        """One unary call (`method`: "kv.Range", "lease.LeaseGrant", ...), moving to the next
        member while a member provably did nothing with it, every member at most once and all
        within one connect + request timeout (the hop budget) or the request's deadline.
        `may_resend`: the call changes nothing (a read), so any unavailability moves it on."""
        connect, read = timeout or self.timeout
        deadline = self._deadline(timeout)
        last = EtcdUnavailable("etcd call out of time")
        for attempt in range(len(self.members)):
            member = self._member()
            remaining = deadline - time.monotonic()
            if remaining <= 0.05:
                break
            try:
                member.connect(min(connect, remaining), patient=attempt == len(self.members) - 1)
                stub_name, _, name = method.partition(".")
                rpc = getattr(getattr(member, stub_name), name)
                answer_in = max(0.05, min(read, deadline - time.monotonic()))
                if method in _ONE_MESSAGE_STREAMS:
                    return _one_answer(rpc, request, answer_in)
                return rpc(request, timeout=answer_in)
            except _Refused as exc:
                self._next_member(member)
                last = exc.unavailable
            except grpc.RpcError as exc:
                mapped = _mapped(exc, may_resend=may_resend)
                if isinstance(mapped, EtcdUnavailable | _Refused):
                    self._next_member(member)
                if isinstance(mapped, _Refused):
                    last = mapped.unavailable
                    continue
                raise mapped from None
        raise last

    # -- KV

    def range(self, key: str, *, prefix: bool = False, count_only: bool = False) -> RangeResult:
        answer = self.call(
            "kv.Range", range_request(key, prefix=prefix, count_only=count_only), may_resend=True
        )
        return range_result(answer)

    def txn(
        self,
        compares: list[rpc_pb2.Compare],
        success: list[RequestOp],
        failure: list[RequestOp] | None = None,
    ) -> TxnResult:
        request = rpc_pb2.TxnRequest(compare=compares, success=success, failure=failure or [])
        reads_only = not writes(success) and not writes(failure or [])
        return txn_result(self.call("kv.Txn", request, may_resend=reads_only))

    def read(self, *ops: RequestOp) -> TxnResult:
        """Several ranges at one revision (a txn with no compares always takes `success`)."""
        return self.txn([], list(ops))

    # -- leases

    def lease_grant(self, ttl_s: int) -> tuple[int, int]:
        """A new lease; returns (id, granted TTL in seconds: etcd may raise it to its minimum)."""
        answer = self.call("lease.LeaseGrant", rpc_pb2.LeaseGrantRequest(TTL=ttl_s))
        if answer.error:
            raise EtcdError(f"etcd error: {answer.error}")
        return answer.ID, answer.TTL or ttl_s

    def lease_keepalive(self, lease_id: int) -> int:
        """Refresh once, on a keepalive stream that ends with the answer; the lease's TTL in
        seconds, 0 when it has expired or never existed. A refresh changes nothing but the
        lease's deadline, so it may be asked again of another member."""
        request = rpc_pb2.LeaseKeepAliveRequest(ID=lease_id)
        answer = self.call("lease.LeaseKeepAlive", request, may_resend=True)
        return int(answer.TTL) if answer is not None else 0

    def lease_revoke(self, lease_id: int) -> bool:
        """Revoke (deleting every attached key at once); False when it was already gone."""
        try:
            self.call("lease.LeaseRevoke", rpc_pb2.LeaseRevokeRequest(ID=lease_id))
        except EtcdUnavailable:
            raise
        except EtcdError as exc:
            if "not found" in str(exc):
                return False
            raise
        return True

    # -- cluster

    def status(self, timeout: float | None = None) -> rpc_pb2.StatusResponse:
        return self.call(
            "maintenance.Status",
            rpc_pb2.StatusRequest(),
            may_resend=True,
            timeout=(self.timeout[0], timeout) if timeout else None,
        )

    def has_leader(self) -> bool:
        return self.status().leader != 0

    # -- watch

    @contextlib.contextmanager
    def _watch(
        self, creates: list[rpc_pb2.WatchCreateRequest], *, timeout_s: float
    ) -> Iterator[Iterator[rpc_pb2.WatchResponse]]:
        """One watch stream, a watcher per create request, on the current member. A member
        whose channel does not connect in time hands the watch to the next, each member at most
        once; anything else, or no member left, is EtcdUnavailable. The stream is cancelled on
        exit (which cancels its watchers server-side)."""
        last = EtcdUnavailable("no etcd member to watch on")
        done = threading.Event()

        def requests() -> Iterator[rpc_pb2.WatchRequest]:
            for create in creates:
                yield rpc_pb2.WatchRequest(create_request=create)
            done.wait()  # keep the send side open: etcd ends the stream when it closes

        for attempt in range(len(self.members)):
            member = self._member()
            try:
                member.connect(
                    min(self.timeout[0], timeout_s), patient=attempt == len(self.members) - 1
                )
            except _Refused as exc:
                self._next_member(member)
                last = exc.unavailable
                continue
            stream = member.watch.Watch(
                requests(), timeout=max(0.05, timeout_s), metadata=_REQUIRE_LEADER
            )
            try:
                yield stream
            finally:
                done.set()
                stream.cancel()
            return
        raise last

    def wait_for_change(
        self,
        keys: list[str],
        *,
        after_revision: int,
        timeout_s: float,
        deletions_only: bool = False,
    ) -> bool:
        """Block until any of `keys` changes (is deleted, with `deletions_only`) after
        `after_revision`, or `timeout_s` passes.

        One watch stream with one watcher per key, starting at after_revision + 1 so a change
        between the caller's read and this call is not missed. True on a change, False on
        timeout. The stream is cancelled on every return, which cancels the watchers
        server-side.
        """
        deadline = time.monotonic() + timeout_s
        filters = [rpc_pb2.WatchCreateRequest.NOPUT] if deletions_only else []
        creates = [
            rpc_pb2.WatchCreateRequest(
                key=key_bytes(key), start_revision=after_revision + 1, filters=filters
            )
            for key in keys
        ]
        if timeout_s <= 0:
            return False
        with self._watch(creates, timeout_s=timeout_s) as stream:
            try:
                for answer in stream:
                    if answer.events:
                        return True
                    if answer.canceled or answer.compact_revision:
                        return True  # the caller re-reads; a compacted watch is a change
                    if time.monotonic() >= deadline:
                        return False
            except grpc.RpcError as exc:
                code, _ = _status(exc)
                if code == grpc.StatusCode.DEADLINE_EXCEEDED or time.monotonic() >= deadline:
                    return False  # the stream's deadline is our deadline
                raise EtcdUnavailable(f"watch stream broke: {_status(exc)[1]}") from None
            # the server closed the stream: look again unless the deadline passed
            return time.monotonic() < deadline

    def deletions(
        self, prefixes: list[str], *, after_revision: int, idle_timeout_s: float
    ) -> Iterator[tuple[int, KeyValue | None]]:
        """Yield (revision, previous kv) for every key deleted under `prefixes`.

        One stream, one watcher per prefix (NOPUT, prev_kv), from after_revision + 1, that
        lasts idle_timeout_s; then it yields (revision, None) and ends, so the caller can check
        for shutdown and reconnect from the last revision it saw (nothing is missed: the next
        stream starts after that revision).
        """
        creates = [
            rpc_pb2.WatchCreateRequest(
                key=key_bytes(prefix),
                range_end=range_end(prefix),
                start_revision=after_revision + 1,
                filters=[rpc_pb2.WatchCreateRequest.NOPUT],
                prev_kv=True,
            )
            for prefix in prefixes
        ]
        revision = after_revision
        with self._watch(creates, timeout_s=idle_timeout_s) as stream:
            try:
                for answer in stream:
                    if answer.compact_revision:
                        revision = max(revision, answer.compact_revision - 1)
                        return
                    for event in answer.events:
                        kv = key_value(event.prev_kv) if event.HasField("prev_kv") else None
                        revision = max(revision, event.kv.mod_revision or revision)
                        yield revision, kv
            except grpc.RpcError as exc:
                code, details = _status(exc)
                if code != grpc.StatusCode.DEADLINE_EXCEEDED and revision == after_revision:
                    if code == grpc.StatusCode.UNAVAILABLE:
                        raise EtcdUnavailable(f"watch stream broke: {details}") from None
                yield revision, None  # the stream's time is up, or it broke: reconnect


__all__ = [
    "REQUEST_DEADLINE",
    "EtcdClient",
    "EtcdError",
    "EtcdUnavailable",
    "Member",
    "request_deadline",
]
