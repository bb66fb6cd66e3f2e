"""Route each app to its role's database alias (only the ops role has more than one)."""

from __future__ import annotations

from django.conf import settings


def _alias(app_label: str) -> str:
    return settings.APP_DATABASES.get(app_label, "default")


class AppDatabaseRouter:
    def db_for_read(self, model, **hints):
        return _alias(model._meta.app_label)

    def db_for_write(self, model, **hints):
        return _alias(model._meta.app_label)

    def allow_relation(self, obj1, obj2, **hints):
        return _alias(obj1._meta.app_label) == _alias(obj2._meta.app_label)

    def allow_migrate(self, db, app_label, model_name=None, **hints):
        return db == _alias(app_label)


def alias_for(app_label: str) -> str:
    """The database alias an app's raw SQL must use (`connections[alias_for("lockserver")]`)."""
    return _alias(app_label)
