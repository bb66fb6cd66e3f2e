"""A cursor for fixed hot SQL that PostgreSQL parses and plans once per pooled connection.

Django's own cursor binds parameters client-side (the values are spliced into the text), so
the server parses, analyses and plans every statement on every call, and psycopg never
prepares it. The fenced statements of payments and the rail proxy are fixed texts run on every
payout: `prepared_cursor()` runs them through a server-binding psycopg cursor on the same
pooled connection instead (so `transaction.atomic` and the pool still apply), wrapped by
Django's cursor wrapper (query log, `django_assert_num_queries`, driver errors as
`django.db` errors). psycopg prepares a statement once it has run `prepare_threshold` times
on a connection (settings/base.py `database()`); the ORM's client-binding cursors never do.
The cursor counts in django-prometheus' `django_db_*` series as the ORM's cursors do.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, cast

import psycopg
from django.db import connections

from dlock.pgbackend.base import counting_cursor_class

if TYPE_CHECKING:
    from collections.abc import Iterator


def server_cursor_class(alias: str) -> type[psycopg.Cursor]:
    """psycopg's server-binding cursor, counted in django-prometheus' `django_db_execute_total`,
    `django_db_query_duration_seconds` and `django_db_errors_total` under `alias`, as the
    cursors of the django-prometheus engine (settings.base.DB_ENGINE) are."""
    return cast(type[psycopg.Cursor], counting_cursor_class(psycopg.Cursor, alias, "postgresql"))


@contextlib.contextmanager
def prepared_cursor(alias: str) -> Iterator[Any]:
    """Django's cursor wrapper around a server-binding psycopg cursor on `alias`'s connection."""
    wrapper = connections[alias]
    with wrapper.wrap_database_errors:
        wrapper.ensure_connection()
    wrapper.validate_thread_sharing()
    raw = cast(Any, server_cursor_class(alias)(wrapper.connection))  # stubs: Django's wrapper
    cursor = wrapper.make_debug_cursor(raw) if wrapper.queries_logged else wrapper.make_cursor(raw)
    try:
        yield cursor
    finally:
        cursor.close()
