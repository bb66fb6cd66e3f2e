"""The etcd backend's background work: the live sessions/grants gauges and the expiry watcher
(`session_expired`, `lock_expired` for keys etcd deleted when a lease ran out)."""

from __future__ import annotations

import threading

from dlock.logs import log_event
from dlock.metrics import lock_live_grants, lock_live_sessions
from dlock.timefmt import rfc3339_ms
from lockserver.backends.etcd.keys import KeySpace, _deadline_passed, _from_ms
from lockserver.etcd_client import EtcdClient, EtcdError, KeyValue, get


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
        """Log `session_expired` and `lock_expired` for keys etcd deleted at a lease's expiry.

        A deleted `sess/` key whose value is not marked closing (L3 marks it first) expired; a
        deleted `lock/` key whose recorded deadline had passed expired (an explicit release or
        revoke deletes it before). Every lock-server replica logs what it sees (as pg's reaper
        does once, a deployment with N replicas has N such lines per expiry).
        """
        revision = 0
        while not self._stopping.is_set():
            try:
                if revision == 0:
                    revision = self.client.read().revision
                for seen, kv in self.client.deletions(
                    [self._k("sess") + "/", self._k("lock") + "/"],
                    after_revision=revision,
                    idle_timeout_s=5.0,
                ):
                    revision = seen
                    if kv is not None:
                        self._log_expiry(kv)
                    if self._stopping.is_set():
                        return
            except (EtcdError, ValueError, KeyError):
                self._stopping.wait(1.0)  # etcd down: try again; NOT_LEADER is the requests' job

    def _log_expiry(self, kv: KeyValue) -> None:
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
        elif _deadline_passed(kv):
            log_event(
                "lock_expired",
                backend=self.name,
                key=kv.key[len(self._k("lock") + "/") :],
                fencingToken=self._token(kv),
                ownerId=value.get("ownerId"),
                sessionId=value.get("sessionId"),
            )
