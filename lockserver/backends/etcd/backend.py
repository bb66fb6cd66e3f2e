"""`EtcdLockBackend`: the lock backend on etcd v3 (lock.backend=etcd), same wire behaviour as pg
(FR-09). The key layout is described in `keys`; the parts live in `tokens` (the token offset),
`sessions` (L1–L3), `grants` (L5–L8), `acquire` (L4 and its waiters) and `housekeeping`
(gauges and the expiry watcher). Every setting is read from django.conf.settings, whose defaults
live once in settings/base.py.
"""

from __future__ import annotations

import logging
import threading
import uuid

from django.conf import settings

from lockserver.backends.etcd.acquire import AcquireMixin
from lockserver.backends.etcd.housekeeping import HousekeepingMixin
from lockserver.backends.etcd.tokens import TokenFloorUnavailable
from lockserver.budget import RetryBudget
from lockserver.etcd_client import EtcdClient, EtcdUnavailable

logger = logging.getLogger("dlock.lockserver.etcd")


class EtcdLockBackend(AcquireMixin, HousekeepingMixin):
    name = "etcd"

    def __init__(
        self,
        *,
        url: str | None = None,
        prefix: str | None = None,
        token_floor: int | None = None,
        ensure_floor: bool = True,
        adopt_pg_sequence: bool | None = None,
        housekeeping: bool = True,
    ) -> None:
        self.url = url or settings.ETCD_URL
        self.prefix = prefix if prefix is not None else settings.ETCD_PREFIX
        self.client = EtcdClient(
            self.url,
            connect_timeout=settings.ETCD_CONNECT_TIMEOUT_MS / 1000,
            read_timeout=settings.ETCD_REQUEST_TIMEOUT_MS / 1000,
        )
        self.token_floor = token_floor if token_floor is not None else settings.LOCK_TOKEN_FLOOR
        self.retention_s = max(60, settings.LOCK_SESSION_RETENTION_MS // 1000)
        self.waiter_cap = settings.LOCK_MAX_WAITERS_PER_KEY
        self.budget = RetryBudget(
            budget=settings.LOCK_RETRY_BUDGET, window_ms=settings.LOCK_RETRY_WINDOW_MS
        )
        self._stopping = threading.Event()
        self._offset: int | None = None
        self._owners: dict[uuid.UUID, str] = {}
        self._offset_guard = threading.Lock()
        self._ceiling = -1
        self._ceiling_guard = threading.Lock()
        self._unavailable_logged = False
        self._refill_at = -1e9
        self.reserve_block = settings.LOCK_TOKEN_RESERVE_BLOCK
        self._refill_deferred_logged = False
        self._retention_lease: tuple[int, float] | None = None  # (lease id, created monotonic)
        self._retention_guard = threading.Lock()
        # grant leases made here (id -> TTL s) and the emptied ones kept for reuse, by TTL
        self._grant_leases: dict[int, int] = {}
        self._spare_leases: dict[int, list[int]] = {}
        # per grant lease: etcd expires it no earlier than this (monotonic, `_grant_lease`)
        self._lease_cover: dict[int, float] = {}
        # grant leases that carry their `glease/` marker (keys.py; the expiry watcher)
        self._marked_leases: set[int] = set()
        self._lease_guard = threading.Lock()
        self.adopt_pg_sequence = (
            adopt_pg_sequence
            if adopt_pg_sequence is not None
            else settings.LOCK_TOKEN_FLOOR_FROM_PG
        )
        if ensure_floor:
            try:
                self.ensure_token_floor()
            except EtcdUnavailable:
                # not a refusal: no token is issued before the floor is ensured (every grant
                # needs _current_offset()), and requests answer 503 NOT_LEADER until then
                logger.warning("etcd unreachable at start-up; token floor checked on first use")
        if housekeeping:
            threading.Thread(
                target=self._housekeep_forever,
                args=(settings.LOCK_HOUSEKEEPING_MS / 1000,),
                name="dlock-etcd-housekeeping",
                daemon=True,
            ).start()
            threading.Thread(
                target=self._watch_expiries_forever, name="dlock-etcd-expiries", daemon=True
            ).start()

    def check_ready(self) -> None:
        """Readiness: the member has a leader and the token floor is in force."""
        if not self.client.has_leader():
            raise EtcdUnavailable("the etcd member has no leader")
        self._current_offset()

    def check_lockdb(self) -> str:
        """lockdb's readiness under etcd: UP when it answers; DEGRADED while it does not but
        tokens remain under the reserved ceiling (acquires keep working); raises (DOWN) when
        none remain — from then on no token can be issued until lockdb is back."""
        try:
            with self._lockdb(background=True, probe=True) as cursor:
                cursor.execute("SELECT 1")
            return "UP"
        except TokenFloorUnavailable:
            headroom = self.token_headroom()
            if headroom is None or headroom > 0:
                return "DEGRADED"
            raise

    def close(self) -> None:
        self._stopping.set()
        self.client.close()
