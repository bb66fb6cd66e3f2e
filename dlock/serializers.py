"""Input serializers that reject what DRF would coerce: "5" for an int, 5 for a string, extras."""

from __future__ import annotations

import uuid
from typing import Any

from rest_framework import serializers

from dlock.headers import INT64_MAX


class StrictIntegerField(serializers.IntegerField):
    """JSON integers only: no strings, floats or booleans."""

    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictInt64Field(StrictIntegerField):
    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("max_value", INT64_MAX)
        kwargs.setdefault("min_value", -INT64_MAX - 1)
        super().__init__(**kwargs)


class StrictCharField(serializers.CharField):
    """JSON strings only; no silent str(5)."""

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictBooleanField(serializers.BooleanField):
    def to_internal_value(self, data: Any) -> bool:
        if not isinstance(data, bool):
            self.fail("invalid")
        return data


class StrictSerializer(serializers.Serializer):
    """Unknown fields are a VALIDATION_FAILED, not silently dropped."""

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        if not isinstance(data, dict):
            raise serializers.ValidationError({"body": ["must be a JSON object"]})
        unknown = sorted(set(data) - set(self.fields))
        if unknown:
            raise serializers.ValidationError({name: ["unknown field"] for name in unknown})
        return super().to_internal_value(data)


def parse_uuid(raw: str, *, field: str) -> uuid.UUID:
    """A canonical UUID from a path or body, else VALIDATION_FAILED naming the field."""
    from dlock.errors import validation_error

    try:
        value = uuid.UUID(raw)
    except (ValueError, TypeError, AttributeError):
        raise validation_error(
            f"{field} must be a UUID", [{"field": field, "message": "uuid"}]
        ) from None
    if str(value) != raw.lower():
        raise validation_error(f"{field} must be a UUID", [{"field": field, "message": "uuid"}])
    return value
