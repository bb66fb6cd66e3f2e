"""django-prometheus' PostgreSQL engine (the `django_db_*` metrics), its counting cursor class
made once per alias instead of at every connect.

django-prometheus wraps the cursor class in `get_connection_params`, which Django calls at each
connect; with Django's connection pool (settings.base `database()`) every request connects, so
the stock engine built a new class per request, and its cyclic garbage (docs/CHANGELOG.md).
The class made here is django-prometheus' own (`ExportingCursorWrapper`), cached: the same
metrics, labels and behaviour.

The pool is Django's, built as Django builds it, with one difference in its `check`: psycopg_pool
checks every connection before handing it out (a poll of its socket; an empty query when the
server sent something or closed it), and when a check fails (the server restarted or
the network broke) `ConnectionPool.check()` sweeps every other idle connection at once. Without
the sweep, each request after a restart met the pool's dead connections one at a time, a
second's back-off apiece, and ran out of its queue deadline (503 OVERLOADED).
"""

from __future__ import annotations

import select
from functools import cache
from typing import Any

from django.db.backends.base.base import NO_DB_ALIAS
from django_prometheus.db.backends.postgresql import base as instrumented
from django_prometheus.db.common import ExportingCursorWrapper
from psycopg import Connection, Cursor
from psycopg_pool import ConnectionPool


@cache
def counting_cursor_class(cursor_class: type, alias: str, vendor: str) -> type:
    """django-prometheus' counting subclass of `cursor_class` for `alias`, made once."""
    return ExportingCursorWrapper(cursor_class, alias, vendor)


def check_connection(conn: Connection) -> None:
    """`ConnectionPool.check_connection` (an empty query, in autocommit) on a plain cursor: the
    pool's check is no statement of the application's, so django_db_execute_total skips it."""
    autocommit = conn.autocommit
    if not autocommit:
        conn.autocommit = True
    try:
        with Cursor(conn) as cursor:
            cursor.execute("")
    finally:
        if not autocommit:
            conn.autocommit = False


def quiet(conn: Connection) -> bool:
    """True when an idle connection's socket has nothing to read. An idle connection the server
    ended (a restart's "terminating connection", a closed socket) has its message or its EOF
    waiting to be read, and one psycopg already found broken says so; either is checked with a
    round trip. A poll of the socket costs no round trip."""
    if conn.closed or conn.broken:
        return False
    poller = select.poll()
    poller.register(conn.fileno(), select.POLLIN | select.POLLPRI)
    return not poller.poll(0)


class SweepingCheck:
    """psycopg_pool's check of one connection; when it fails, every idle one is checked too.
    A quiet connection (nothing from the server since its last answer) is handed out without
    the empty query: the round trip would tell nothing the socket does not."""

    def __init__(self) -> None:
        self.pool: ConnectionPool | None = None

    def __call__(self, conn: Connection) -> None:
        if quiet(conn):
            return
        try:
            check_connection(conn)
        except Exception:
            if self.pool is not None:
                # The others idle since before the failure are most likely as dead: discard
                # and replace them now, not one per request.
                self.pool.check()
            raise


class DatabaseWrapper(instrumented.DatabaseWrapper):
    @property
    def pool(self) -> ConnectionPool | None:
        """Django's pool (its options, its `configure`), its `check` a SweepingCheck."""
        options = self.settings_dict["OPTIONS"].get("pool")
        if self.alias == NO_DB_ALIAS or not options:
            return None
        if self.alias not in self._connection_pools:
            params = self.get_connection_params()
            params["autocommit"] = True  # as Django's: it sets the mode itself later
            check = SweepingCheck()
            pool = ConnectionPool(
                kwargs=params,
                open=False,
                configure=self._configure_connection,
                check=check,
                **({} if options is True else options),
            )
            check.pool = pool
            # setdefault: threads racing at start-up each build one, the first one stays
            self._connection_pools.setdefault(self.alias, pool)
        return self._connection_pools[self.alias]

    def get_connection_params(self) -> dict[str, Any]:
        # Django's own parameters (the next class in the MRO after django-prometheus' engine,
        # whose override differs from this one only in making the class anew)
        params = super(instrumented.DatabaseWrapper, self).get_connection_params()
        params["cursor_factory"] = counting_cursor_class(
            params["cursor_factory"], self.alias, self.vendor
        )
        return params
