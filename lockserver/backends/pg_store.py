"""The pg lock backend's store: cursors on Django's pooled connection (prepared, server-binding),
store errors mapped to C3 codes, commit hooks, and the token floor applied before the first token.

`PgLockBackend` composes it with the wait queue (`pg_wait`) and the housekeeper
(`pg_housekeeping`); every statement of `pg_sql` runs on a cursor of this store.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

import psycopg
from django.conf import settings
from django.db import DatabaseError, InterfaceError, OperationalError, connections, transaction
from psycopg_pool import PoolTimeout, TooManyRequests

from dlock.errors import ApiError, Code
from dlock.logs import log_event
from dlock.prepared import server_cursor_class
from lockserver.backends import token_sql

if TYPE_CHECKING:
    from psycopg.abc import Params

INT64_MAX = 2**63 - 1


class Reachability(Protocol):
    """Whether the database answered lately (the listener's connection says)."""

    @property
    def db_up(self) -> bool: ...


class PreparingCursor:
    """Every statement of backends.pg_sql is a fixed text: prepare it (per connection)."""

    def __init__(self, cursor: psycopg.Cursor) -> None:
        self._cursor = cursor

    def execute(self, query: str, params: Params | None = None) -> psycopg.Cursor:
        return self._cursor.execute(query, params, prepare=True)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)


class PgStore:
    """What every pg statement goes through. `reachability` (the backend's listener) tells
    "database down" (503 NOT_LEADER) from "pool exhausted" (503 OVERLOADED)."""

    def __init__(self, *, alias: str, backend: str, reachability: Reachability) -> None:
        self.alias = alias
        self.backend = backend
        self._reachability = reachability
        self._floor_applied = False
        self._floor_refusal_logged = False
        self._floor_guard = threading.Lock()

    @contextlib.contextmanager
    def cursor(self, *, pooled: bool = False) -> Iterator:
        """Autocommit statements; `pooled`: the hot paths' (L4/L5/L6), see _prepared_cursor."""
        # Not through _store_errors_mapped: one context manager less around every statement
        # of the hot paths; the mapping is the same `_raise_store_error`.
        try:
            with self._prepared_cursor(pooled=pooled) as cursor:
                yield cursor
        except DatabaseError as exc:
            self._raise_store_error(exc)
            raise

    @contextlib.contextmanager
    def atomic(self) -> Iterator:
        """One transaction on Django's connection for this alias; store errors mapped."""
        with (
            self._store_errors_mapped(),
            transaction.atomic(using=self.alias),
            self._prepared_cursor() as cursor,
        ):
            yield cursor

    @contextlib.contextmanager
    def _store_errors_mapped(self) -> Iterator[None]:
        try:
            yield
        except DatabaseError as exc:
            self._raise_store_error(exc)
            raise

    def _raise_store_error(self, exc: DatabaseError) -> None:
        """Raise the typed error a store failure maps to; return when it maps to none."""
        error = self._store_error(exc)
        if error is not None:
            raise error from exc

    @contextlib.contextmanager
    def _prepared_cursor(self, *, pooled: bool = False) -> Iterator:
        """A server-binding psycopg cursor on Django's pooled connection for this alias.

        Django's own cursor binds client-side and never prepares, so PostgreSQL would parse and
        plan the (large, CTE) lock statements on every call; these are prepared once per pooled
        connection instead. It is Django's connection, so transaction.atomic and the pool apply;
        with `pooled` (the L4/L5/L6 statements), unless Django already holds this thread's
        connection or a transaction is open, the statement takes a connection from the same pool
        and hands it back at once instead, which skips Django's per-request connect and close
        bookkeeping. Either way driver errors surface as django.db errors.
        """
        wrapper = connections[self.alias]
        with wrapper.wrap_database_errors:
            pool = wrapper.pool
            if (
                pooled
                and pool is not None
                and wrapper.connection is None
                and not wrapper.in_atomic_block
            ):
                # An autocommit statement with nothing of Django's open: the pool's connection
                # for this statement only, without Django's per-request connect/close work.
                if pool.closed:
                    pool.open()
                connection = pool.getconn()
                try:
                    with server_cursor_class(self.alias)(connection) as cursor:
                        yield PreparingCursor(cursor)
                finally:
                    pool.putconn(connection)  # idle (autocommit), or discarded if broken
                return
            wrapper.ensure_connection()
            with server_cursor_class(self.alias)(wrapper.connection) as cursor:
                yield PreparingCursor(cursor)

    def _store_error(self, exc: DatabaseError) -> ApiError | None:
        """A store that cannot take writes is NOT_LEADER (503), never a 500.

        No pool slot while the listener cannot reach the database is "database down", not
        OVERLOADED; anything else is left to dlock.handlers (None).
        """
        cause = exc.__cause__
        if isinstance(cause, PoolTimeout) and not self._reachability.db_up:
            return ApiError(Code.NOT_LEADER, "lock database unreachable")
        if getattr(cause, "sqlstate", None) == "25006":  # read_only_sql_transaction
            return ApiError(Code.NOT_LEADER, "lock database is read-only (standby or fenced)")
        deadline = getattr(cause, "sqlstate", None) in ("57014", "55P03")
        overload = isinstance(cause, PoolTimeout | TooManyRequests)
        if isinstance(exc, OperationalError | InterfaceError) and not (deadline or overload):
            return ApiError(Code.NOT_LEADER, "lock database unreachable")
        return None

    def ensure_token_floor(self) -> None:
        """Before the first token: the sequence above LOCK_TOKEN_FLOOR and above the deployment's
        token high water (tokens an etcd period issued), so no token is ever issued twice or
        below one a resource has seen. Until it is done, every call answers 503 NOT_LEADER."""
        if self._floor_applied:
            return
        with self._floor_guard:
            if self._floor_applied:
                return
            floor = settings.LOCK_TOKEN_FLOOR
            with self.atomic() as cursor:
                high_water, _ = token_sql.read_high_water(cursor)
                target = max(floor, high_water)
                if target >= INT64_MAX:
                    raise self._floor_refused(target)
                last = token_sql.apply_token_floor(cursor, floor=target)
                token_sql.raise_high_water(cursor, token=last, backend=self.backend)
            log_event(
                "token_floor_checked",
                backend=self.backend,
                floor=floor,
                highWater=high_water,
                lastToken=last,
            )
            self._floor_applied = True

    def _floor_refused(self, target: int) -> ApiError:
        if not self._floor_refusal_logged:
            self._floor_refusal_logged = True
            log_event(
                "token_floor_refused",
                level=logging.ERROR,
                backend=self.backend,
                floor=target,
                reason="no int64 token exceeds the deployment's token high water",
            )
        return ApiError(Code.NOT_LEADER, "the token floor cannot be made safe on this store")

    def release_connection(self) -> None:
        """Give the pooled connection back before blocking: a waiter holds no DB slot."""
        connections[self.alias].close()

    def after_commit(self, action: Callable[[], None]) -> None:
        """Run `action` once what this thread just wrote has committed: at the end of the open
        transaction, or at once after an autocommit statement (committed once it answered)."""
        if connections[self.alias].in_atomic_block:
            transaction.on_commit(action, using=self.alias)
        else:
            action()
