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


@pytest.mark.django_db(transaction=True)
def test_an_idle_connection_the_server_ended_is_not_quiet_and_fails_its_check():
    """The pool's check skips the round trip only for a connection the server has not written to
    or closed; one whose backend was terminated (what a restart does) is checked, and fails."""
    from dlock.pgbackend.base import SweepingCheck, quiet

    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params["autocommit"] = True
    with psycopg.connect(**params) as idle, psycopg.connect(**params) as admin:
        assert quiet(idle)
        SweepingCheck()(idle)  # quiet: handed out with no statement
        pid = idle.info.backend_pid
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        for _ in range(200):  # the backend ends asynchronously; its FATAL then reaches the socket
            if not quiet(idle):
                break
            admin.execute("SELECT pg_sleep(0.01)")
        assert not quiet(idle)
        with pytest.raises(psycopg.OperationalError):
            SweepingCheck()(idle)
