"""Route each app to its role's database alias (only the ops role has more than one)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.conf import settings

if TYPE_CHECKING:
    from django.db.models import Model


def _alias(app_label: str) -> str:
    return settings.APP_DATABASES.get(app_label, "default")


class AppDatabaseRouter:
    def db_for_read(self, model: type[Model], **hints: Any) -> str:
        return _alias(model._meta.app_label)

    def db_for_write(self, model: type[Model], **hints: Any) -> str:
        return _alias(model._meta.app_label)

    def allow_relation(self, obj1: Model, obj2: Model, **hints: Any) -> bool:
        return _alias(obj1._meta.app_label) == _alias(obj2._meta.app_label)

    def allow_migrate(
        self, db: str, app_label: str, model_name: str | None = None, **hints: Any
    ) -> bool:
        return db == _alias(app_label)


def alias_for(app_label: str) -> str:
    """The database alias an app's raw SQL must use (`connections[alias_for("lockserver")]`)."""
    return _alias(app_label)
