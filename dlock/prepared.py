"""A cursor for fixed hot SQL that PostgreSQL parses and plans once per pooled connection.

Django's own cursor binds parameters client-side (the values are spliced into the text), so
the server parses, analyses and plans every statement on every call, and psycopg never
prepares it. The fenced statements of payments and the rail proxy are fixed texts run on every
payout: `prepared_cursor()` runs them through a server-binding psycopg cursor on the same
pooled connection instead (so `transaction.atomic` and the pool still apply), wrapped by
Django's cursor wrapper (query log, `django_assert_num_queries`, driver errors as
`django.db` errors). psycopg prepares a statement once it has run `prepare_threshold` times
on a connection (settings/base.py `database()`); the ORM's client-binding cursors never do.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, cast

import psycopg
from django.db import connections

if TYPE_CHECKING:
    from collections.abc import Iterator


@contextlib.contextmanager
def prepared_cursor(alias: str) -> Iterator[Any]:
    """Django's cursor wrapper around a server-binding psycopg cursor on `alias`'s connection."""
    wrapper = connections[alias]
    with wrapper.wrap_database_errors:
        wrapper.ensure_connection()
    wrapper.validate_thread_sharing()
    raw = cast(Any, psycopg.Cursor(wrapper.connection))  # the stubs expect Django's wrapper here
    cursor = wrapper.make_debug_cursor(raw) if wrapper.queries_logged else wrapper.make_cursor(raw)
    try:
        yield cursor
    finally:
        cursor.close()
