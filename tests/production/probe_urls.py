"""Probe views that do real database work through the shared kernel (pool, deadlines, handler).

They exist only for tests/production: the capacity, deadline and drain behaviour belongs to the
kernel (settings.base.database, dlock.handlers, dlock.serving), not to any one app.
"""

from __future__ import annotations

import gc

from django.db import connection, transaction
from django.urls import path
from rest_framework.response import Response
from rest_framework.views import APIView

from dlock.urls import common_patterns, handler404, handler500  # noqa: F401

SCHEMA = """
CREATE TABLE IF NOT EXISTS probe_row (id int PRIMARY KEY, n int NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS probe_log (id serial PRIMARY KEY, tag text NOT NULL);
INSERT INTO probe_row (id) VALUES (1), (2), (3), (4), (5) ON CONFLICT DO NOTHING;
"""


class BumpView(APIView):
    """One transaction: log the attempt, then update a row (which a test may hold locked)."""

    def post(self, request, row: int):
        tag = str(request.data.get("tag", ""))
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("INSERT INTO probe_log (tag) VALUES (%s)", [tag])
            cursor.execute("UPDATE probe_row SET n = n + 1 WHERE id = %s RETURNING n", [row])
            (n,) = cursor.fetchone()
        return Response({"row": row, "n": n})


class SleepView(APIView):
    """Holds a database slot for `ms` milliseconds (pg_sleep), then answers 200."""

    def get(self, request):
        ms = int(request.query_params.get("ms", "0"))
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_sleep(%s)", [ms / 1000])
        return Response({"slept": ms})


class HeapView(APIView):
    """What the worker's garbage collector holds in its permanent generation (gc.freeze)."""

    def get(self, request):
        return Response({"frozen": gc.get_freeze_count(), "tracked": len(gc.get_objects())})


urlpatterns = [
    path("probe/bump/<int:row>", BumpView.as_view()),
    path("probe/heap", HeapView.as_view()),
    path("probe/sleep", SleepView.as_view()),
    *common_patterns(),
]
