"""The etcd backend's background work: the live sessions/grants gauges and the expiry watcher
(`session_expired`, `lock_expired` for keys etcd deleted when a lease ran out)."""

from __future__ import annotations

import threading

from dlock.logs import log_event
from dlock.metrics import lock_live_grants, lock_live_sessions
from dlock.timefmt import rfc3339_ms
from lockserver.backends.etcd.keys import KeySpace, deadline_passed, from_epoch_ms
from lockserver.backends.etcd.tokens import TokenAllocator
from lockserver.etcd_client import EtcdClient, EtcdError, EtcdUnavailable
from lockserver.etcd_ops import KeyValue, get


class Housekeeping:
    """The live sessions/grants gauges and the expiry watcher, each on a thread of its own."""

    def __init__(
        self,
        *,
        name: str,
        client: EtcdClient,
        keys: KeySpace,
        tokens: TokenAllocator,
        stopping: threading.Event,
    ) -> None:
        self.name = name
        self.client = client
        self.keys = keys
        self.tokens = tokens
        self._stopping = stopping

    def live_counts(self) -> tuple[int, int]:
        """(sessions, grant keys) for the gauges (a grant of a just-expired session may count
        until the takeover or its own lease removes it)."""
        read = self.client.read(
            get(self.keys.k("sess") + "/", prefix=True, count_only=True),
            get(self.keys.k("lock") + "/", prefix=True, count_only=True),
        )
        return read.responses[0].count, read.responses[1].count

    def housekeep_forever(self, interval_s: float) -> None:
        while not self._stopping.wait(interval_s):
            try:
                sessions, grants = self.live_counts()
            except EtcdError:
                continue
            lock_live_sessions.labels(backend=self.name).set(sessions)
            lock_live_grants.labels(backend=self.name).set(grants)

    def watch_expiries_forever(self) -> None:
        """Log `session_expired` and `lock_expired`, once each, for keys etcd deleted when a
        lease ran out; reconnects from the last revision seen (never replays it twice)."""
        revision = 0
        while not self._stopping.is_set():
            try:
                if revision == 0:
                    revision = self.client.read().revision
                revision = self.log_expiries(after_revision=revision, idle_timeout_s=5.0)
            except (EtcdError, ValueError, KeyError):
                self._stopping.wait(1.0)  # etcd down: try again; NOT_LEADER is the requests' job

    def expiry_watch_prefixes(self) -> list[str]:
        """What every replica's expiry watcher streams the deletions of."""
        return [self.keys.k("sess") + "/", self.keys.k("glease") + "/"]

    def log_expiries(self, *, after_revision: int, idle_timeout_s: float) -> int:
        """One watch stream of deletions after `after_revision`; the last revision handled.

        A deleted `sess/` key whose value is not marked closing (L3 marks it first) expired.
        Grants: the stream watches the `glease/` markers, not `lock/`, so a release is no event
        at all for any replica; a marker is deleted only when its lease ends (expiry or
        revoke), with every key on the lease at that one revision. The grant that lease carried
        just before (read at that revision − 1) expired if its recorded deadline has passed: a
        grant ended on purpose (release, revoke, takeover, re-acquire) was deleted by an
        earlier revision and is not on the lease then, however late this watcher sees the
        deletion (e.g. replayed after a reconnect). Every lock-server replica logs what it sees
        (N replicas, N lines per expiry).
        """
        revision = after_revision
        for seen, kv in self.client.deletions(
            self.expiry_watch_prefixes(),
            after_revision=after_revision,
            idle_timeout_s=idle_timeout_s,
        ):
            if kv is not None:
                self._log_expiry(kv, seen)
            revision = seen
            if self._stopping.is_set():
                break
        return revision

    def _grant_on_lease(self, lease: int, revision: int) -> KeyValue | None:
        """The grant lease `lease` carried just before `revision`, when the lease ended."""
        try:
            read = self.client.read(
                get(self.keys.k("lock") + "/", prefix=True, revision=revision - 1)
            )
        except EtcdUnavailable:
            raise
        except EtcdError:
            return None  # compacted: cannot tell, so no alarm (a false page is the worse error)
        return next((kv for kv in read.responses[0].kvs if kv.lease == lease), None)

    def _log_expiry(self, kv: KeyValue, revision: int) -> None:
        if kv.key.startswith(self.keys.k("sess") + "/"):
            value = kv.json()
            if not value.get("closing"):
                log_event(
                    "session_expired",
                    backend=self.name,
                    sessionId=kv.key.rsplit("/", 1)[-1],
                    ownerId=value.get("ownerId"),
                    expiredAt=rfc3339_ms(from_epoch_ms(value["expiresAt"])),
                )
            return
        grant = self._grant_on_lease(kv.lease, revision)
        # a grant deleted before its deadline (L3 revokes its lease) did not expire either
        if grant is None or not deadline_passed(grant):
            return
        kv, value = grant, grant.json()
        key = kv.key[len(self.keys.k("lock") + "/") :]
        log_event(
            "lock_expired",
            backend=self.name,
            key=key,
            fencingToken=self.tokens.token(kv),
            ownerId=value.get("ownerId"),
            sessionId=value.get("sessionId"),
        )
