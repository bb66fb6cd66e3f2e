"""The PostgreSQL engine: django-prometheus' counting cursors, the class made once per alias."""

from __future__ import annotations

import psycopg
import pytest
from django.db import connection, connections

from dlock.pgbackend.base import DatabaseWrapper
from dlock.prepared import server_cursor_class


def test_every_connect_reuses_one_counting_cursor_class():
    assert isinstance(connections[connection.alias], DatabaseWrapper)
    first = connection.get_connection_params()["cursor_factory"]
    second = connection.get_connection_params()["cursor_factory"]
    assert first is second
    assert first.__qualname__ == "ExportingCursorWrapper.<locals>.CursorWrapper"
    assert issubclass(first, psycopg.ClientCursor)


def test_the_hot_cursors_share_the_cache_but_bind_server_side():
    hot = server_cursor_class(connection.alias)
    assert hot is server_cursor_class(connection.alias)
    assert issubclass(hot, psycopg.Cursor)
    assert not issubclass(hot, psycopg.ClientCursor)


@pytest.mark.django_db(transaction=True)
def test_a_statement_on_a_fresh_connection_is_counted():
    from prometheus_client import REGISTRY

    labels = {"alias": connection.alias, "vendor": connection.vendor}
    before = REGISTRY.get_sample_value("django_db_execute_total", labels) or 0.0
    connection.close()
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        assert cursor.fetchone() == (1,)
    assert REGISTRY.get_sample_value("django_db_execute_total", labels) == before + 1
