"""The etcd backend's token source: token = offset + create_revision, the offset persisted under
`meta/token_offset` and raised so that every next token exceeds the deployment's floor.

The floor is max(LOCK_TOKEN_FLOOR, the deployment's token high water in lockdb: the
`lock_token_high_water` row and pg's `fencing_token_seq`). Tokens issued here are covered by a
*reserved ceiling* in that row: before a token above the ceiling is handed out, the row is
raised (GREATEST) to that token + a block (LOCK_TOKEN_RESERVE_BLOCK), so lockdb is written
once per block, not per grant, and the row is always ≥ every token this backend issued. A
start on pg or on a fresh etcd cluster then starts above it. If lockdb cannot be read or
written when a token above the ceiling is due, no token is issued: 503 NOT_LEADER, readiness
DOWN, one `token_floor_unavailable` line.

The block is refilled ahead of need: once fewer than half a block of tokens
remain under the ceiling, a background attempt raises it again, so while lockdb is reachable the
backend always holds at least half a block of tokens it may issue without lockdb. That is
how long it serves through a lockdb outage: until etcd's revision (every write, not only grants,
advances it) crosses the ceiling — `token_headroom()` says how many remain; readiness reports
lockdb DEGRADED while some do and DOWN only when none do.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator

import psycopg

from dlock.logs import log_event
from lockserver.backends import token_sql
from lockserver.backends.etcd.keys import INT64_MAX, KeySpace
from lockserver.etcd_client import EtcdClient, EtcdUnavailable
from lockserver.etcd_ops import KeyValue, compare, get, put

logger = logging.getLogger("dlock.lockserver.etcd")

# Tokens reserved in lockdb per write (LOCK_TOKEN_RESERVE_BLOCK's default); a switch of backend
# or cluster skips at most one block. The reservation is refilled in the background once fewer
# than half a block remain under the ceiling.
HIGH_WATER_BLOCK = 10_000
REFILL_RETRY_S = 1.0  # at most one background refill attempt per second while lockdb is down


class TokenFloorError(RuntimeError):
    """The backend cannot guarantee that its next token exceeds LOCK_TOKEN_FLOOR."""


class TokenFloorUnavailable(EtcdUnavailable):
    """lockdb's token high water cannot be read or raised now: nothing may be issued (a store
    outage to callers, 503 NOT_LEADER), retried on the next call."""


class TokenAllocator:
    """The token offset in force (token = offset + create_revision) and the lockdb reservation
    that covers every token issued."""

    def __init__(
        self,
        *,
        name: str,
        client: EtcdClient,
        keys: KeySpace,
        token_floor: int,
        adopt_pg_sequence: bool,
        reserve_block: int,
    ) -> None:
        self.name = name
        self.client = client
        self.keys = keys
        self.token_floor = token_floor
        self.adopt_pg_sequence = adopt_pg_sequence  # read and keep lockdb's token high water
        self.reserve_block = reserve_block  # tokens reserved per lockdb write
        self._offset: int | None = None
        self._offset_guard = threading.Lock()
        self._ceiling = -1  # the reserved ceiling last written (or read) in lockdb; -1: none yet
        self._ceiling_guard = threading.Lock()
        self._unavailable_logged = False
        self._refill_at = -1e9  # monotonic time of the last background refill attempt
        self._refill_deferred_logged = False

    def ensure_token_floor(self) -> int:
        """Persist (or raise) the token offset so that every next token exceeds the floor.

        token = offset + create_revision and every later create_revision exceeds the current
        store revision R, so offset + R >= floor suffices. Raising the offset is always safe
        (grants keep the offset they were issued with); the only unsafe case is an int64
        overflow, which raises TokenFloorError. Returns the offset in force.
        """
        configured = int(self.token_floor or 0)
        if configured < 0 or configured >= INT64_MAX // 2:
            raise TokenFloorError(f"LOCK_TOKEN_FLOOR={configured} is outside 0..{INT64_MAX // 2}")
        high_water = self._lockdb_high_water()
        floor = max(configured, high_water)
        if floor >= INT64_MAX // 2:
            raise TokenFloorError(f"the token high water {floor} is outside 0..{INT64_MAX // 2}")
        offset, revision = self._raise_offset(floor)
        self.reserve(offset + revision + 1)
        self._offset = offset
        return offset

    def _raise_offset(self, floor: int) -> tuple[int, int]:
        """(offset in force, revision read): offset + revision >= floor, compare-and-swapped."""
        while True:
            read = self.client.read(get(self.keys.offset_key))
            revision = read.revision
            current = read.responses[0].first() if read.responses[0] else None
            if current is None:
                offset = max(0, floor - revision)
                guard = compare(self.keys.offset_key, "CREATE", "EQUAL", 0)
            else:
                try:
                    stored = int(current.value)
                except ValueError:
                    raise TokenFloorError(
                        f"{self.keys.offset_key} holds {current.value!r}, not an integer"
                    ) from None
                if stored + revision >= floor:
                    return stored, revision
                offset = floor - revision
                guard = compare(self.keys.offset_key, "MOD", "EQUAL", current.mod_revision)
            result = self.client.txn([guard], [put(self.keys.offset_key, str(offset))])
            if result.succeeded:
                log_event(
                    "token_offset_set",
                    backend="etcd",
                    offset=offset,
                    floor=floor,
                    revision=revision,
                    previous=None if current is None else int(current.value),
                )
                return offset, revision
            # another lock-server replica wrote it first: read again

    @contextlib.contextmanager
    def lockdb(self, *, background: bool = False, probe: bool = False) -> Iterator[psycopg.Cursor]:
        """A short autocommit connection of its own to lockdb (rare: start-up, once per block).
        A failed `background` refill is not an outage to callers: it logs no ERROR. A readiness
        `probe` proves only that lockdb answers, not that the high water can be read: it leaves
        the logged-once state alone."""
        from django.db import connections

        from dlock.dbrouter import alias_for

        params = dict(connections[alias_for("lockserver")].get_connection_params())
        for name in ("cursor_factory", "context", "prepare_threshold", "pool"):
            params.pop(name, None)
        params["connect_timeout"] = 2
        params["autocommit"] = True
        try:
            with psycopg.connect(**params) as conn, conn.cursor() as cursor:
                yield cursor
        except psycopg.Error as exc:
            if not background:
                self._log_unavailable(exc)
            raise TokenFloorUnavailable(f"lockdb token high water unavailable: {exc}") from exc
        if probe:
            return
        self._unavailable_logged = False
        self._refill_deferred_logged = False

    def _log_unavailable(self, exc: Exception) -> None:
        if not self._unavailable_logged:
            self._unavailable_logged = True
            log_event(
                "token_floor_unavailable",
                level=logging.ERROR,
                backend=self.name,
                reason=f"lockdb token high water unreachable; no token is issued until it is: "
                f"{type(exc).__name__}: {str(exc).strip()[:200]}",
            )

    def _lockdb_high_water(self) -> int:
        """Every token this deployment issued (pg sequence, etcd reservations) is ≤ this."""
        if not self.adopt_pg_sequence:
            return 0
        with self.lockdb() as cursor:
            row, sequence = token_sql.read_high_water(cursor)
        with self._ceiling_guard:
            self._ceiling = max(self._ceiling, row)
        return max(row, sequence)

    def reserve(self, token: int) -> None:
        """Make sure lockdb's high water covers `token` before anyone learns of it."""
        if not self.adopt_pg_sequence:
            return
        if token <= self._ceiling:
            if self._ceiling - token < self.reserve_block // 2:
                self._refill_soon(token)
            return
        with self._ceiling_guard:
            if token <= self._ceiling:
                return
            with self.lockdb() as cursor:
                ceiling = token_sql.raise_high_water(
                    cursor, token=token + self.reserve_block, backend=self.name
                )
            self._ceiling = ceiling

    def _refill_soon(self, token: int) -> None:
        """Raise the ceiling to `token` + a block in the background (one attempt at a time, at
        most one per REFILL_RETRY_S): the request that noticed the low reserve never waits."""
        now = time.monotonic()
        if now - self._refill_at < REFILL_RETRY_S:
            return
        self._refill_at = now
        threading.Thread(
            target=self._refill, args=(token,), name="dlock-etcd-token-refill", daemon=True
        ).start()

    def _refill(self, token: int) -> None:
        if not self._ceiling_guard.acquire(blocking=False):
            return  # a synchronous reservation is running: it raises the ceiling itself
        try:
            with self.lockdb(background=True) as cursor:
                ceiling = token_sql.raise_high_water(
                    cursor, token=token + self.reserve_block, backend=self.name
                )
            self._ceiling = max(self._ceiling, ceiling)
        except TokenFloorUnavailable as exc:
            if not self._refill_deferred_logged:
                self._refill_deferred_logged = True
                log_event(
                    "token_reserve_low",
                    level=logging.WARNING,
                    backend=self.name,
                    ceiling=self._ceiling,
                    headroom=self._ceiling - token,
                    reason=f"lockdb unreachable; tokens are issued until the reserved ceiling: "
                    f"{str(exc.__cause__ or exc).strip()[:200]}",
                )
        finally:
            self._ceiling_guard.release()

    def token_headroom(self) -> int | None:
        """How many more tokens (etcd revisions) may be issued before lockdb must be written
        again; None when the lockdb high water is off (LOCK_TOKEN_FLOOR_FROM_PG=false)."""
        if not self.adopt_pg_sequence:
            return None
        revision = self.client.read(get(self.keys.offset_key)).revision
        return self._ceiling - (self.current_offset() + revision)

    def current_offset(self) -> int:
        if self._offset is None:
            with self._offset_guard:
                if self._offset is None:
                    self.ensure_token_floor()
        assert self._offset is not None
        return self._offset

    def refresh_offset(self) -> None:
        """The stored offset is not the one this process holds. Raised by another replica: adopt
        it (that replica ensured the floor when it raised it, and every token issued since
        carries an offset ≤ it, so stored + any later revision exceeds them all). Missing (a new
        cluster) or lower than ours (a restored store): ensure the floor again, from lockdb."""
        with self._offset_guard:
            current = self.client.read(get(self.keys.offset_key)).responses[0]
            stored = current.first() if current else None
            try:
                value = int(stored.value) if stored is not None else None
            except ValueError:
                value = None
            if value is not None and self._offset is not None and value >= self._offset:
                log_event(
                    "token_offset_adopted", backend="etcd", offset=value, previous=self._offset
                )
                self._offset = value
                return
            self.ensure_token_floor()

    def next_token_lower_bound(self) -> int:
        """Every token issued from now on is greater than this (operators: the switch floor)."""
        revision = self.client.read(get(self.keys.offset_key)).revision
        return self.current_offset() + revision

    def token(self, kv: KeyValue) -> int:
        return kv.json()["offset"] + kv.create_revision
