"""The etcd backend's background work: the live sessions/grants gauges and the expiry watcher
(`session_expired`, `lock_expired` for keys etcd deleted when a lease ran out)."""

from __future__ import annotations

import threading

from dlock.logs import log_event
from dlock.metrics import lock_live_grants, lock_live_sessions
from dlock.timefmt import rfc3339_ms
from lockserver.backends.etcd.keys import KeySpace, _deadline_passed, _from_ms
from lockserver.etcd_client import EtcdClient, EtcdError, EtcdUnavailable
from lockserver.etcd_ops import KeyValue, get


class HousekeepingMixin(KeySpace):
    name: str
    client: EtcdClient
    _stopping: threading.Event

    def live_counts(self) -> tuple[int, int]:
        """(sessions, grant keys) for the gauges (a grant of a just-expired session may count
        until the takeover or its own lease removes it)."""
        read = self.client.read(
            get(self._k("sess") + "/", prefix=True, count_only=True),
            get(self._k("lock") + "/", prefix=True, count_only=True),
        )
        return read.responses[0].count, read.responses[1].count

    def _housekeep_forever(self, interval_s: float) -> None:
        while not self._stopping.wait(interval_s):
            try:
                sessions, grants = self.live_counts()
            except EtcdError:
                continue
            lock_live_sessions.labels(backend=self.name).set(sessions)
            lock_live_grants.labels(backend=self.name).set(grants)

    def _watch_expiries_forever(self) -> None:
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

    def log_expiries(self, *, after_revision: int, idle_timeout_s: float) -> int:
        """One watch stream of deletions after `after_revision`; the last revision handled.

        A deleted `sess/` key whose value is not marked closing (L3 marks it first) expired. A
        deleted `lock/` key expired if its recorded deadline has passed and nothing ended it on
        purpose: every release, revoke,
        takeover and re-acquire re-puts `seen/{key}` in the deleting txn, so a deletion at a
        revision where `seen/{key}` was also written is not an expiry — however late this
        watcher sees it (e.g. replayed after a reconnect, when the recorded deadline has long
        passed). Every lock-server replica logs what it sees (N replicas, N lines per expiry).
        """
        revision = after_revision
        for seen, kv in self.client.deletions(
            [self._k("sess") + "/", self._k("lock") + "/"],
            after_revision=after_revision,
            idle_timeout_s=idle_timeout_s,
        ):
            if kv is not None:
                self._log_expiry(kv, seen)
            revision = seen
            if self._stopping.is_set():
                break
        return revision

    def _ended_on_purpose(self, key: str, revision: int) -> bool:
        """`seen/{key}` was written by the txn that deleted `lock/{key}` at `revision`."""
        try:
            marker = self.client.read(get(self._k("seen", key), revision=revision))
        except EtcdUnavailable:
            raise
        except EtcdError:
            return True  # compacted: cannot tell, so no alarm (a false page is the worse error)
        kv = marker.responses[0].first()
        return kv is not None and kv.mod_revision == revision

    def _log_expiry(self, kv: KeyValue, revision: int) -> None:
        value = kv.json()
        if kv.key.startswith(self._k("sess") + "/"):
            if not value.get("closing"):
                log_event(
                    "session_expired",
                    backend=self.name,
                    sessionId=kv.key.rsplit("/", 1)[-1],
                    ownerId=value.get("ownerId"),
                    expiredAt=rfc3339_ms(_from_ms(value["expiresAt"])),
                )
            return
        key = kv.key[len(self._k("lock") + "/") :]
        # a grant deleted before its deadline (L3 revokes its lease) did not expire either
        if not _deadline_passed(kv) or self._ended_on_purpose(key, revision):
            return
        log_event(
            "lock_expired",
            backend=self.name,
            key=key,
            fencingToken=self._token(kv),
            ownerId=value.get("ownerId"),
            sessionId=value.get("sessionId"),
        )
