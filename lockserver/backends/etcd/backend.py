"""`EtcdLockBackend`: the lock backend on etcd v3 (lock.backend=etcd), same wire behaviour as pg
(FR-09), composed of parts with public interfaces: the key space (`keys`, which also describes
the layout), the token allocator (`tokens`), the grant lease pool (`leases`), `sessions`
(L1–L3), `grants` (L5–L8), `waiters` (a key's queue), the `acquire` part (L4) and
`housekeeping` (gauges and the expiry watcher). Every setting is read from
django.conf.settings, whose defaults live once in settings/base.py.
"""

from __future__ import annotations

import logging
import threading
import uuid
from typing import Any

from django.conf import settings

from lockserver.backends.base import (
    GrantRecord,
    HeartbeatRecord,
    LockInfoRecord,
    RevocationRecord,
    SessionRecord,
)
from lockserver.backends.etcd.acquire import Acquirer
from lockserver.backends.etcd.grants import Grants
from lockserver.backends.etcd.housekeeping import Housekeeping
from lockserver.backends.etcd.keys import KeySpace
from lockserver.backends.etcd.leases import LeasePool
from lockserver.backends.etcd.sessions import Sessions
from lockserver.backends.etcd.tokens import TokenAllocator, TokenFloorUnavailable
from lockserver.backends.etcd.waiters import Waiters
from lockserver.budget import RetryBudget
from lockserver.etcd_client import EtcdClient, EtcdUnavailable

logger = logging.getLogger("dlock.lockserver.etcd")


class EtcdLockBackend:
    """`LockBackend` on etcd, composed of parts with public interfaces: `keys` (the key space),
    `tokens` (the token allocator), `leases` (the grant lease pool), `sessions`, `grants`,
    `waiters`, the `acquirer` that uses them for L4, and `housekeeping`."""

    name = "etcd"
    # The credential that opened a session is kept in the session's own record, written by
    # the put that creates it: L1-L6 never need lockdb on this backend.
    records_session_credential = True

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
        self.client = EtcdClient(
            self.url,
            connect_timeout=settings.ETCD_CONNECT_TIMEOUT_MS / 1000,
            read_timeout=settings.ETCD_REQUEST_TIMEOUT_MS / 1000,
        )
        self.keys = KeySpace(prefix if prefix is not None else settings.ETCD_PREFIX)
        self.tokens = TokenAllocator(
            name=self.name,
            client=self.client,
            keys=self.keys,
            token_floor=token_floor if token_floor is not None else settings.LOCK_TOKEN_FLOOR,
            adopt_pg_sequence=adopt_pg_sequence
            if adopt_pg_sequence is not None
            else settings.LOCK_TOKEN_FLOOR_FROM_PG,
            reserve_block=settings.LOCK_TOKEN_RESERVE_BLOCK,
        )
        self.leases = LeasePool(self.client, self.keys)
        self.sessions = Sessions(
            name=self.name,
            client=self.client,
            keys=self.keys,
            tokens=self.tokens,
            retention_s=max(60, settings.LOCK_SESSION_RETENTION_MS // 1000),
        )
        self.grants = Grants(
            name=self.name,
            client=self.client,
            keys=self.keys,
            tokens=self.tokens,
            leases=self.leases,
            sessions=self.sessions,
        )
        self.waiters = Waiters(
            name=self.name,
            client=self.client,
            keys=self.keys,
            leases=self.leases,
            cap=settings.LOCK_MAX_WAITERS_PER_KEY,
        )
        self.acquirer = Acquirer(
            name=self.name,
            client=self.client,
            keys=self.keys,
            tokens=self.tokens,
            leases=self.leases,
            sessions=self.sessions,
            grants=self.grants,
            waiters=self.waiters,
            budget=RetryBudget(
                budget=settings.LOCK_RETRY_BUDGET, window_ms=settings.LOCK_RETRY_WINDOW_MS
            ),
        )
        self._stopping = threading.Event()
        self.housekeeping = Housekeeping(
            name=self.name,
            client=self.client,
            keys=self.keys,
            tokens=self.tokens,
            stopping=self._stopping,
        )
        self._start(ensure_floor=ensure_floor, housekeeping=housekeeping)

    def _start(self, *, ensure_floor: bool, housekeeping: bool) -> None:
        """The composed parts' start-up work: the token floor, then the background threads."""
        if ensure_floor:
            try:
                self.tokens.ensure_token_floor()
            except EtcdUnavailable:
                # not a refusal: no token is issued before the floor is ensured (every grant
                # needs current_offset()), and requests answer 503 NOT_LEADER until then
                logger.warning("etcd unreachable at start-up; token floor checked on first use")
        if housekeeping:
            threading.Thread(
                target=self.housekeeping.housekeep_forever,
                args=(settings.LOCK_HOUSEKEEPING_MS / 1000,),
                name="dlock-etcd-housekeeping",
                daemon=True,
            ).start()
            threading.Thread(
                target=self.housekeeping.watch_expiries_forever,
                name="dlock-etcd-expiries",
                daemon=True,
            ).start()

    # -- LockBackend

    def open_session(
        self, *, owner_id: str, ttl_ms: int, credential_id: str | None = None
    ) -> SessionRecord:
        return self.sessions.open_session(
            owner_id=owner_id, ttl_ms=ttl_ms, credential_id=credential_id
        )

    def session_credential(self, session_id: uuid.UUID) -> tuple[bool, str | None]:
        return self.sessions.session_credential(session_id)

    def heartbeat(self, *, session_id: uuid.UUID, owner_id: str) -> HeartbeatRecord:
        return self.sessions.heartbeat(session_id=session_id, owner_id=owner_id)

    def close_session(self, *, session_id: uuid.UUID, owner_id: str) -> None:
        self.sessions.close_session(session_id=session_id, owner_id=owner_id)

    def acquire(
        self, *, key: str, session_id: uuid.UUID, owner_id: str | None, ttl_ms: int, wait_ms: int
    ) -> GrantRecord:
        return self.acquirer.acquire(
            key=key, session_id=session_id, owner_id=owner_id, ttl_ms=ttl_ms, wait_ms=wait_ms
        )

    def renew(
        self, *, key: str, session_id: uuid.UUID, token: int, ttl_ms: int | None
    ) -> GrantRecord:
        return self.grants.renew(key=key, session_id=session_id, token=token, ttl_ms=ttl_ms)

    def release(self, *, key: str, session_id: uuid.UUID, token: int) -> None:
        self.grants.release(key=key, session_id=session_id, token=token)

    def inspect(self, *, key: str) -> LockInfoRecord:
        return self.grants.inspect(key=key)

    def revoke(
        self, *, key: str, operator: str, reason: str, expected_token: int | None
    ) -> RevocationRecord:
        return self.grants.revoke(
            key=key, operator=operator, reason=reason, expected_token=expected_token
        )

    def revocations(self) -> list[dict[str, Any]]:
        return self.grants.revocations()

    # -- tokens, readiness, background work

    def ensure_token_floor(self) -> int:
        return self.tokens.ensure_token_floor()

    def next_token_lower_bound(self) -> int:
        return self.tokens.next_token_lower_bound()

    def token_headroom(self) -> int | None:
        return self.tokens.token_headroom()

    def live_counts(self) -> tuple[int, int]:
        return self.housekeeping.live_counts()

    def check_ready(self) -> None:
        """Readiness: the member has a leader and the token floor is in force."""
        if not self.client.has_leader():
            raise EtcdUnavailable("the etcd member has no leader")
        self.tokens.current_offset()

    def check_lockdb(self) -> str:
        """lockdb's readiness under etcd: UP when it answers; DEGRADED while it does not but
        tokens remain under the reserved ceiling (acquires keep working); raises (DOWN) when
        none remain — from then on no token can be issued until lockdb is back."""
        try:
            with self.tokens.lockdb(background=True, probe=True) as cursor:
                cursor.execute("SELECT 1")
            return "UP"
        except TokenFloorUnavailable:
            headroom = self.tokens.token_headroom()
            if headroom is None or headroom > 0:
                return "DEGRADED"
            raise

    def close(self) -> None:
        self._stopping.set()
        self.client.close()
