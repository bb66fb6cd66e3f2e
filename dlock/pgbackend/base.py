"""django-prometheus' PostgreSQL engine (the `django_db_*` metrics), its counting cursor class
made once per alias instead of at every connect.

django-prometheus wraps the cursor class in `get_connection_params`, which Django calls at each
connect; with Django's connection pool (settings.base `database()`) every request connects, so
the stock engine built a new class per request, and its cyclic garbage (docs/CHANGELOG.md).
The class made here is django-prometheus' own (`ExportingCursorWrapper`), cached: the same
metrics, labels and behaviour.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from django_prometheus.db.backends.postgresql import base as instrumented
from django_prometheus.db.common import ExportingCursorWrapper


@cache
def counting_cursor_class(cursor_class: type, alias: str, vendor: str) -> type:
    """django-prometheus' counting subclass of `cursor_class` for `alias`, made once."""
    return ExportingCursorWrapper(cursor_class, alias, vendor)


class DatabaseWrapper(instrumented.DatabaseWrapper):
    def get_connection_params(self) -> dict[str, Any]:
        # Django's own parameters (the next class in the MRO after django-prometheus' engine,
        # whose override differs from this one only in making the class anew)
        params = super(instrumented.DatabaseWrapper, self).get_connection_params()
        params["cursor_factory"] = counting_cursor_class(
            params["cursor_factory"], self.alias, self.vendor
        )
        return params
