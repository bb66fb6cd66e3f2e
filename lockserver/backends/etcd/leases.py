"""The etcd backend's grant leases: a pool of the leases this process granted for grants and
queue entries, an emptied one kept (by TTL) for the next grant instead of granting a new one, each
with the earliest moment etcd may expire it, and the `glease/` marker the expiry watcher needs
(keys.py)."""

from __future__ import annotations

import logging
import threading
from time import monotonic

from lockserver.backends.etcd.common import LEASE_COVER_MARGIN_S, LEASE_SLACK_S
from lockserver.backends.etcd.keys import KeySpace, epoch_ms, utc_now
from lockserver.etcd_client import EtcdClient, EtcdError, EtcdUnavailable
from lockserver.etcd_ops import RequestOp

logger = logging.getLogger("dlock.lockserver.etcd")


class LeasePool:
    """Thread-safe. `grant_leases`: lease id -> TTL of the grant it was made for; `spare_leases`:
    emptied ones by TTL; `lease_cover`: per lease, the monotonic time before which etcd cannot
    have expired it."""

    def __init__(self, client: EtcdClient, keys: KeySpace) -> None:
        self.client = client
        self.keys = keys
        self.grant_leases: dict[int, int] = {}
        self.spare_leases: dict[int, list[int]] = {}
        self.lease_cover: dict[int, float] = {}
        self._with_marker: set[int] = set()  # leases that carry their glease/ marker
        self._guard = threading.Lock()

    def is_ours(self, lease: int) -> bool:
        """A lease this pool granted and a grant holds now."""
        with self._guard:
            return lease in self.grant_leases

    def grant(self, seconds: int) -> tuple[int, int]:
        """(a lease with no key on it that lives at least `seconds` from now, its expiresAt in
        epoch ms: now + `seconds`). Both clocks are read before the lease is granted or
        refreshed, so the reported deadline is never later than etcd's own expiry of the lease:
        a successor's acquiredAt cannot fall before its predecessor's expiresAt.

        A lease this process emptied (`recycle`) carries the next grant of the same TTL. Grant
        leases are granted LEASE_SLACK_S longer than the grant, and each remembers the lower
        bound of etcd's expiry its last grant or keepalive answer gave (sent at + TTL answered,
        on this process's monotonic clock): while that still covers the new grant's deadline
        (with LEASE_COVER_MARGIN_S to spare) the lease is used as it is, no call at all;
        otherwise a keepalive resets it (the leader's lessor: no raft proposal). Either way a
        pair costs two durable writes, the create and the compare-and-delete, as etcd's own
        lock recipe does."""
        while True:
            now = monotonic()
            expires_ms = epoch_ms(utc_now()) + seconds * 1000
            with self._guard:
                spare = self.spare_leases.get(seconds)
                lease = spare.pop() if spare else 0
                covered = self.lease_cover.get(lease, 0.0)
                if lease and covered - now >= seconds + LEASE_COVER_MARGIN_S:
                    self.grant_leases[lease] = seconds
                    return lease, expires_ms
            if not lease:
                break
            try:
                ttl = self.client.lease_keepalive(lease)
                if ttl > 0:
                    with self._guard:
                        self.grant_leases[lease] = seconds
                        self.lease_cover[lease] = now + ttl
                    return lease, expires_ms
            except EtcdUnavailable:
                raise
            except EtcdError:
                pass  # expired meanwhile: try the next, or grant one
            with self._guard:
                self.lease_cover.pop(lease, None)
        lease, ttl = self.client.lease_grant(seconds + LEASE_SLACK_S)
        with self._guard:
            if len(self.grant_leases) > 10_000:
                self.grant_leases.clear()
                self.lease_cover.clear()
            self.grant_leases[lease] = seconds
            self.lease_cover[lease] = now + ttl
        return lease, expires_ms

    def recycle(self, lease: int) -> None:
        """A grant lease of ours that no key is attached to any more: kept for the next grant of
        the same TTL (it expires on its own if none comes); one not made here is left alone."""
        with self._guard:
            seconds = self.grant_leases.pop(lease, None)
            if seconds is None:
                return
            spare = self.spare_leases.setdefault(seconds, [])
            if len(spare) < 256:
                spare.append(lease)
            else:
                self.lease_cover.pop(lease, None)

    def lost(self, exc: EtcdError, lease: int) -> bool:
        """`exc` says a put named a lease etcd no longer has (revoked behind this process's
        back, or a store restored without it): forget it and every kept lease of its TTL (they
        are suspect alike), so the next `grant` grants a fresh one; False for any other
        error."""
        if isinstance(exc, EtcdUnavailable) or "lease not found" not in str(exc):
            return False
        with self._guard:
            seconds = self.grant_leases.pop(lease, None)
            self.lease_cover.pop(lease, None)
            for spare in self.spare_leases.pop(seconds, []) if seconds is not None else []:
                self.lease_cover.pop(spare, None)
        return True

    def unmarked(self, lease: int) -> list[RequestOp]:
        """The lease's `glease/` marker, for the txn that puts the first grant on it (the
        expiry watcher's signal: keys.py); nothing once a grant txn on it succeeded."""
        with self._guard:
            return [] if lease in self._with_marker else [self.keys.lease_marker(lease)]

    def marked(self, lease: int) -> None:
        with self._guard:
            if len(self._with_marker) > 20_000:
                self._with_marker.clear()  # a marker put again is harmless
            self._with_marker.add(lease)

    def revoke_quietly(self, lease: int) -> None:
        try:
            self.client.lease_revoke(lease)
        except EtcdError:
            logger.info("could not revoke unused lease %s (it expires on its own)", lease)
