"""Input serializers that reject what DRF would coerce: "5" for an int, 5 for a string, extras."""

from __future__ import annotations

import uuid
from collections.abc import Callable
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


def common_shape(serializer: type[serializers.Serializer]) -> Callable[[Any], dict | None]:
    """A check of the common, well-formed body derived from `serializer`'s declared fields and
    its `validate_<field>` methods (one definition): the validated data, or None when the body
    is not in that shape and the caller must run the serializer (which owns every refusal and
    its details). Each check is narrower than the field's (every field present, strings ASCII
    so no NUL or surrogate to look for, nothing to trim) and yields what the serializer would;
    it saves building the serializer on the hot bodies (docs/CHANGELOG.md).
    """
    if serializer.validate is not serializers.Serializer.validate:  # object-level rules
        raise TypeError(f"common_shape: {serializer.__name__} validates across fields")
    checks: list[tuple[str, Callable[[Any], bool], Callable[..., Any] | None]] = []
    for name, field in serializer().fields.items():
        if isinstance(field, StrictCharField):
            ok = _text_check(
                max(field.min_length or 0, 0 if field.allow_blank else 1),
                field.max_length,
                trim=field.trim_whitespace,
            )
        elif isinstance(field, StrictIntegerField):
            ok = _int_check(field.min_value, field.max_value)
        else:  # a field kind this check does not know: never guess, always the serializer
            raise TypeError(f"common_shape: {name} is a {type(field).__name__}")
        checks.append((name, ok, getattr(serializer, f"validate_{name}", None)))
    names = frozenset(name for name, _, _ in checks)

    def check(data: Any) -> dict | None:
        if type(data) is not dict or data.keys() != names:
            return None
        out = {}
        for name, ok, validate in checks:
            value = data[name]
            if not ok(value):
                return None
            if validate is not None:  # the serializer's own method (it reads no state)
                try:
                    value = validate(None, value)
                except serializers.ValidationError:
                    return None
            out[name] = value
        return out

    return check


def _text_check(low: int, high: int | None, *, trim: bool) -> Callable[[Any], bool]:
    def text(v: Any) -> bool:
        return (
            type(v) is str
            and low <= len(v)
            and (high is None or len(v) <= high)
            and v.isascii()
            and "\x00" not in v
            and not (trim and v != v.strip())
        )

    return text


def _int_check(low: int | None, high: int | None) -> Callable[[Any], bool]:
    def integer(v: Any) -> bool:
        return type(v) is int and (low is None or low <= v) and (high is None or v <= high)

    return integer
