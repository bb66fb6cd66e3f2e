"""The event log line: dlock.logs.JsonFormatter's fast path against python-json-logger's own.

`LegacyJsonFormatter` is the formatter as it was before the fast path (python-json-logger's
format, dlock's add_fields): every record below, through both, must give the same line byte
for byte (so the same keys, values, key order, escapes and separators), and `log_event` must
filter and emit as Logger.log did.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import enum
import io
import json
import logging
import random
import sys
import uuid
from typing import Any

import pytest
from pythonjsonlogger.json import JsonFormatter as _BaseJsonFormatter

from dlock import logs
from dlock.tracing import current_trace_id, reset_trace_id, set_trace_id


class LegacyJsonFormatter(_BaseJsonFormatter):
    """dlock.logs.JsonFormatter before issue 18's fast path (commit 690057a)."""

    def __init__(self, *args: Any, service: str = "dlock", **kwargs: Any) -> None:
        kwargs.setdefault("timestamp", "ts")
        super().__init__("%(levelname)s %(name)s %(message)s", *args, **kwargs)
        self.service = service

    def add_fields(self, log_record: dict, record: logging.LogRecord, message_dict: dict) -> None:
        super().add_fields(log_record, record, message_dict)
        log_record["service"] = self.service
        log_record.setdefault("event", getattr(record, "event", None) or "log")
        log_record.setdefault("traceId", current_trace_id())
        log_record["level"] = log_record.pop("levelname", record.levelname)
        log_record["logger"] = log_record.pop("name", record.name)


class Colour(enum.Enum):
    RED = "red"
    TUPLE = (1, 2)


class Size(enum.IntEnum):
    BIG = 7


class Mood(str, enum.Enum):  # noqa: UP042  # the mixin form, not StrEnum
    CALM = "calm"


@dataclasses.dataclass
class Point:
    x: int
    label: str
    when: dt.datetime


class Shouty:
    def __str__(self) -> str:
        return "SHOUTY ü"


class Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("no str")

    def __repr__(self) -> str:
        raise RuntimeError("no repr")


class Text(str):
    pass


class Number(int):
    pass


def _traceback():
    try:
        raise ValueError("for its traceback")
    except ValueError as exc:
        return exc.__traceback__


UTC = dt.UTC
ODD_ZONE = dt.timezone(dt.timedelta(hours=5, minutes=30, seconds=15))
VALUES: list[Any] = [
    "plain",
    "",
    "ünïcödé → 漢字 🙂",
    '\x00\x01\x1f\x7f\n\t\r"\\/',
    "\u2028\u2029",
    "del\x7fonly",
    'items, "quoted": and ,\n  newlines',
    "{\n  }",
    "\ud800 lone surrogate",
    0,
    -1,
    2**63 - 1,
    2**63,
    2**64 - 1,
    2**64,
    -(2**63),
    -(2**63) - 1,
    -(2**70),
    10**40,
    True,
    False,
    None,
    1.5,
    -0.0,
    1e300,
    1e-310,
    1e16,
    float("nan"),
    float("inf"),
    float("-inf"),
    dt.datetime(2026, 12, 1, 18, 53, 24, 123456, tzinfo=UTC),
    dt.datetime(2026, 12, 1, 18, 53, 24, tzinfo=UTC),
    dt.datetime(2026, 12, 1, 18, 53, 24, 5),
    dt.datetime(2026, 12, 1, 18, 53, 24, 5, tzinfo=ODD_ZONE),
    dt.date(2026, 12, 1),
    dt.time(18, 53, 24, 1),
    dt.time(18, 53, tzinfo=UTC),
    dt.timedelta(seconds=3),
    uuid.UUID("5b7f7a8e-1c1e-4a3f-9d7e-2f0c8f1a2b3c"),
    decimal.Decimal("1.10"),
    decimal.Decimal("NaN"),
    b"bytes\x00\xff",
    bytearray(b"\x01\x02"),
    memoryview(b"mv"),
    {1, 2},
    frozenset({"a"}),
    (1, "two", None),
    [1, [2, [3, {"k": "v"}]]],
    {"nested": {"deeper": {"list": [1, 2.5, None, "ü"]}}},
    {1: "int key", 2.5: "float key", False: "bool key", None: "none key"},
    {"uuid": uuid.UUID(int=7), "when": dt.date(2026, 1, 1), "raw": b"x"},
    Colour.RED,
    Colour.TUPLE,
    Colour,
    Size.BIG,
    Mood.CALM,
    Point(1, "p", dt.datetime(2026, 1, 1, tzinfo=UTC)),
    ValueError("boom ü"),
    KeyError("k"),
    ValueError,
    int,
    Shouty(),
    Unprintable(),
    object,
    Text("a str subclass"),
    Number(12),
    _traceback(),
    range(3),
    complex(1, 2),
]
MESSAGES: list[tuple[Any, tuple]] = [
    ("lock_acquired", ()),
    ("with %s and %d", ("a", 3)),
    ("ü %r", (Shouty(),)),
    ("no args but a %", ()),
    (Shouty(), ()),
    (7, ()),
]
NAMES = [
    "field",
    "clientRef",
    "ünï",
    "with space",
    "ts",
    "service",
    "level",
    "logger",
    "traceId",
    "event",
    "_private",
    "__dunder",
    "x" * 40,
]


def _record(
    *,
    msg: Any = "lock_acquired",
    args: tuple = (),
    level: int = logging.INFO,
    name: str = "dlock.events",
    extra: dict | None = None,
    exc_info: Any = None,
    sinfo: str | None = None,
    created: float | None = None,
) -> logging.LogRecord:
    logger = logging.getLogger(name)
    record = logger.makeRecord(name, level, __file__, 1, msg, args, exc_info, "test", extra, sinfo)
    if created is not None:
        record.created = created
    return record


def _both(record: logging.LogRecord, **kwargs: Any) -> tuple[str, str]:
    legacy = LegacyJsonFormatter(service="rail-stub", **kwargs)
    fast = logs.JsonFormatter(service="rail-stub", **kwargs)
    return legacy.format(record), fast.format(record)


def assert_same_line(record: logging.LogRecord, **kwargs: Any) -> str:
    old, new = _both(record, **kwargs)
    assert new == old
    assert "\n" not in new
    json.loads(new)  # one JSON object (NaN and Infinity as json writes them)
    return new


def test_the_fast_path_is_taken_for_the_configured_formatter():
    assert logs.JsonFormatter(service="x")._fast
    assert not logs.JsonFormatter(service="x", json_indent=2)._fast
    assert not logs.JsonFormatter(service="x", rename_fields={"message": "msg"})._fast
    assert not logs.JsonFormatter(service="x", json_ensure_ascii=False)._fast


@pytest.mark.parametrize("index", range(len(VALUES)))
def test_every_value_type_renders_as_python_json_logger_renders_it(index):
    value = VALUES[index]
    assert_same_line(_record(extra={"event": "e", "value": value, "after": 1}))
    assert_same_line(_record(extra={"nested": {"in": [value]}}))


def test_many_random_records_give_the_same_line():
    rng = random.Random(18)
    token = set_trace_id(None)
    try:
        for i in range(3_000):
            extra = {}
            for _ in range(rng.randrange(0, 9)):
                extra[rng.choice(NAMES) + (str(rng.randrange(3)) if rng.random() < 0.5 else "")] = (
                    rng.choice(VALUES)
                )
            if rng.random() < 0.8:
                extra = {"event": rng.choice(["lock_acquired", "", None, "ü"]), **extra}
            msg, args = rng.choice(MESSAGES)
            record = _record(
                msg=msg,
                args=args,
                level=rng.choice([logging.DEBUG, logging.INFO, logging.WARNING, 35, 50]),
                name=rng.choice(["dlock.events", "django.request", "ünï.logger"]),
                extra=extra,
                created=rng.choice(
                    [
                        rng.uniform(0, 4e9),
                        float(rng.randrange(0, 2**32)),
                        rng.randrange(0, 2**31) + 0.0000005,
                        rng.randrange(0, 2**31) + 0.0000015,
                        rng.randrange(0, 2**31) + 0.9999996,
                        rng.randrange(0, 2**31) + 0.9999994,
                        1764615338.259043,
                    ]
                ),
            )
            if i % 7 == 0:
                set_trace_id(f"{i:032x}")
            assert_same_line(record)
    finally:
        reset_trace_id(token)


@pytest.mark.parametrize(
    "created",
    [0.0, 1e-7, 0.5e-6, 1.5e-6, 59.9999995, 1764615338.0, 1764615338.9999999, 4102444800.000001],
)
def test_the_timestamp_rounds_as_datetime_does(created):
    line = assert_same_line(_record(created=created))
    iso = dt.datetime.fromtimestamp(created, tz=dt.UTC).isoformat()
    assert json.loads(line)["ts"] == iso


def test_a_caught_exception_and_stack_info_are_rendered_as_today():
    try:
        raise RuntimeError("broken ü\x00")
    except RuntimeError:
        exc_info = sys.exc_info()
    assert "Traceback" in assert_same_line(_record(exc_info=exc_info, extra={"event": "e"}))
    assert_same_line(_record(exc_info=(None, None, None)))
    assert_same_line(_record(sinfo="Stack (most recent call last):\n  here"))
    record = _record(extra={"event": "e"})
    record.exc_text = "formatted elsewhere"
    assert "formatted elsewhere" in assert_same_line(record)
    assert_same_line(_record(exc_info=exc_info), exc_info_as_array=True)


def test_a_dict_message_and_odd_records_are_rendered_as_today():
    assert_same_line(_record(msg={"event": "from dict", "k": 1}))
    assert_same_line(_record(msg="%(a)s", args=({"a": "mapping arg"},)))
    record = _record(extra={"event": "e"})
    del record.thread  # a record that does not start with LogRecord's own attributes
    record.thread = 1
    record.late = "set after the record was made"
    assert_same_line(record)
    record = _record()
    record.__dict__[7] = "a key that is not a string"
    assert_same_line(record)


def test_a_circular_value_fails_as_it_did():
    loop: list = []
    loop.append(loop)
    record = _record(extra={"loop": loop})
    for formatter in (LegacyJsonFormatter(), logs.JsonFormatter()):
        with pytest.raises(ValueError, match="Circular"):
            formatter.format(record)


class _Keep(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def events():
    logger = logging.getLogger("dlock.events")
    keep = _Keep()
    stream = io.StringIO()
    line = logging.StreamHandler(stream)
    line.setFormatter(logs.JsonFormatter(service="lock-server"))
    saved = (logger.level, logger.propagate)
    logger.addHandler(keep)
    logger.addHandler(line)
    logger.propagate = False
    logger.setLevel(logging.INFO)
    yield logger, keep, stream
    logger.removeHandler(keep)
    logger.removeHandler(line)
    logger.setLevel(saved[0])
    logger.propagate = saved[1]


def test_log_event_writes_one_line_equal_to_the_legacy_formatters(events):
    logger, keep, stream = events
    logs.log_event(
        "lock_acquired",
        key="acct:1",
        fencingToken=2**70,
        ownerId="wörker",
        sessionId=uuid.UUID(int=1),
        expiresAt=dt.datetime(2026, 1, 1, tzinfo=UTC),
        meta={"n": [1, None]},
    )
    (record,) = keep.records
    lines = stream.getvalue().splitlines()
    assert lines == [LegacyJsonFormatter(service="lock-server").format(record)]
    assert record.funcName == "log_event" and record.pathname == logs.__file__
    assert record.event == "lock_acquired" and record.fencingToken == 2**70
    parsed = json.loads(lines[0])
    assert list(parsed) == [
        "message",
        "event",
        "key",
        "fencingToken",
        "ownerId",
        "sessionId",
        "expiresAt",
        "meta",
        "ts",
        "service",
        "traceId",
        "level",
        "logger",
    ]


def test_log_event_filters_by_level_as_logger_log_did(events):
    logger, keep, stream = events
    logger.setLevel(logging.WARNING)
    logs.log_event("quiet", level=logging.INFO, x=1)
    assert keep.records == [] and stream.getvalue() == ""
    assert not logs.event_enabled(logging.INFO)
    logs.log_event("loud", level=logging.WARNING, x=1)
    assert [r.levelname for r in keep.records] == ["WARNING"]
    logger.disabled = True
    try:
        logs.log_event("off", level=logging.ERROR)
    finally:
        logger.disabled = False
    assert len(keep.records) == 1
    with pytest.raises(TypeError):
        logs.log_event("bad level", level="INFO")  # type: ignore[arg-type]


def test_log_event_refuses_a_field_named_like_a_record_attribute(events):
    with pytest.raises(KeyError):
        logs.log_event("x", exc_info=True)
    with pytest.raises(KeyError):
        logs.log_event("x", message="m")


def test_a_typical_event_needs_neither_json_nor_python_json_loggers_path(monkeypatch):
    record = _record(extra={"event": "lock_acquired", "key": "k:1", "fencingToken": 7, "x": None})
    expected = LegacyJsonFormatter(service="rail-stub").format(record)
    formatter = logs.JsonFormatter(service="rail-stub")

    def refuse(*args, **kwargs):
        raise AssertionError("took the slow path")

    monkeypatch.setattr(logs, "_c_make_encoder", refuse)
    monkeypatch.setattr(logs._BaseJsonFormatter, "format", refuse)
    assert formatter.format(record) == expected
