"""The event log line (dlock.logs): python-json-logger's formatter with dlock's fields.

Behaviour, not bytes: one JSON object per line, the fields every line carries, the event's
own fields at the top level, hostile values kept inside their value on that one line,
nothing lost to a value the encoder refuses, exceptions rendered without what they must not
carry, and `log_event` filtering as Logger.log does.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import io
import json
import logging
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from django.test import RequestFactory
from pythonjsonlogger.orjson import OrjsonFormatter

from dlock import logs
from dlock.fence.refusals import fenced_out
from dlock.tracing import reset_trace_id, set_trace_id

ROOT = Path(__file__).resolve().parent.parent
TRACE = "0af7651916cd43dd8448eb211c80319c"
HEX32 = re.compile(r"[0-9a-f]{32}")
OWN = {"event", "message", "level", "logger", "service", "ts", "traceId"}


class _Lines:
    """What a StreamHandler with the roles' formatter writes, as lines and parsed objects."""

    def __init__(self, stream: io.StringIO) -> None:
        self.stream = stream

    @property
    def raw(self) -> str:
        return self.stream.getvalue()

    def parsed(self) -> list[dict[str, Any]]:
        lines = self.raw.split("\n")
        assert lines[-1] == "", "every line ends with a newline"
        return [json.loads(line) for line in lines[:-1]]

    def one(self) -> dict[str, Any]:
        (line,) = self.parsed()
        return line


@pytest.fixture
def events():
    """`dlock.events` (and `dlock.handlers`) writing through the roles' formatter."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logs.JsonFormatter(service="payment-resource"))
    loggers = [logging.getLogger(name) for name in ("dlock.events", "dlock.handlers", "django")]
    saved = [(lg.level, lg.propagate, lg.disabled) for lg in loggers]
    for logger in loggers:
        logger.addHandler(handler)
        logger.propagate = False
        logger.disabled = False
        logger.setLevel(logging.INFO)
    yield _Lines(stream)
    for logger, (level, propagate, disabled) in zip(loggers, saved, strict=True):
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate
        logger.disabled = disabled


@pytest.fixture
def trace():
    token = set_trace_id(TRACE)
    yield TRACE
    reset_trace_id(token)


def test_the_formatter_is_python_json_loggers_own():
    formatter = logs.JsonFormatter(service="x")

    assert isinstance(formatter, OrjsonFormatter)
    # Its features carry dlock's fields; format() and the output path are the library's.
    assert formatter.rename_fields == {"levelname": "level", "name": "logger"}
    assert formatter.static_fields == {"service": "x"}
    assert formatter.defaults == {"event": "log"}
    assert formatter.timestamp == "ts"
    assert "format" not in vars(logs.JsonFormatter)


def test_an_event_is_one_json_line_with_its_fields_at_the_top_level(events, trace):
    logs.log_event(
        "lock_acquired",
        key="payout:acct-1",
        fencingToken=42,
        ownerId="executor-1",
        sessionId=uuid.UUID(int=1),
        expiresAt=dt.datetime(2026, 12, 2, 6, 0, 0, 123000, tzinfo=dt.UTC),
        meta={"n": [1, None, True]},
    )

    line = events.one()
    assert line["event"] == line["message"] == "lock_acquired"
    assert line["service"] == "payment-resource"
    assert line["traceId"] == TRACE
    assert line["level"] == "INFO" and line["logger"] == "dlock.events"
    assert dt.datetime.fromisoformat(line["ts"]).tzinfo is not None
    assert line["key"] == "payout:acct-1" and line["fencingToken"] == 42
    assert line["ownerId"] == "executor-1"
    assert line["sessionId"] == "00000000-0000-0000-0000-000000000001"
    assert line["expiresAt"] == "2026-12-02T06:00:00.123000+00:00"
    assert line["meta"] == {"n": [1, None, True]}
    assert set(line) == OWN | {"key", "fencingToken", "ownerId", "sessionId", "expiresAt", "meta"}


def test_fenced_out_carries_the_five_names_the_architecture_fixes(events, trace):
    fenced_out(
        resource="account",
        resource_id="acct-7",
        presented=11,
        highest=12,
        owner_id="executor-2",
        payoutId="p-1",
    )

    line = events.one()
    assert line["event"] == "fenced_out" and line["level"] == "WARNING"
    assert {k: line[k] for k in ("resource", "resourceId", "presentedToken", "highestToken")} == {
        "resource": "account",
        "resourceId": "acct-7",
        "presentedToken": 11,
        "highestToken": 12,
    }
    assert line["ownerId"] == "executor-2" and line["payoutId"] == "p-1"


def test_outside_a_request_each_line_still_has_a_trace_id(events):
    token = set_trace_id(None)
    try:
        logs.log_event("reaper_ran")
    finally:
        reset_trace_id(token)

    assert HEX32.fullmatch(events.one()["traceId"])


def test_a_line_from_another_library_gets_the_same_envelope(events, trace):
    logging.getLogger("django").warning("plain %s message", "text")

    line = events.one()
    assert line["event"] == "log" and line["message"] == "plain text message"
    assert line["service"] == "payment-resource" and line["traceId"] == TRACE
    assert line["logger"] == "django" and line["level"] == "WARNING"


HOSTILE = [
    'line one\n{"event": "forged", "level": "ERROR"}',
    "carriage\rreturn and \r\n both",
    'quotes " and \\" and \\',
    "".join(chr(c) for c in range(32)) + "\x7f",
    "\x1b[31mred terminal\x1b[0m",
    "\u2028\u2029 separators",
    "\ud800 lone surrogate",
    b"\xff\xfe not utf-8 \xc3\x28".decode("utf-8", "surrogateescape"),
    "ünïcödé → 漢字 🙂",
    "}, {",
]


@pytest.mark.parametrize("value", HOSTILE, ids=range(len(HOSTILE)))
def test_a_hostile_string_stays_inside_its_value_on_one_line(events, value):
    logs.log_event("rail_response", body=value)

    raw = events.raw
    assert raw.count("\n") == 1 and raw.endswith("\n")
    assert raw.isascii() and not any(ch in raw[:-1] for ch in "\r\x00\x1b")
    line = events.one()
    assert line["body"] == value
    assert set(line) == OWN | {"body"} and line["event"] == "rail_response"


@pytest.mark.parametrize("value", HOSTILE, ids=range(len(HOSTILE)))
def test_a_hostile_field_name_is_escaped_like_a_value(events, value):
    logs.log_event("rail_response", **{value: 1, "after": 2})

    raw = events.raw
    assert raw.count("\n") == 1 and raw.isascii()
    line = events.one()
    assert line[value] == 1 and line["after"] == 2 and line["event"] == "rail_response"


def test_raw_bytes_are_written_as_base64_not_as_text(events):
    logs.log_event("e", raw=b"\x00\xff\n", buffer=bytearray(b"ab"))

    line = events.one()
    assert line["raw"] == "AP8K" and line["buffer"] == "YWI="


def test_a_caller_cannot_forge_the_lines_own_fields(events, trace):
    logs.log_event(
        "e",
        service="rail-proxy",
        level=logging.INFO,
        **{"logger": "forged", "ts": "1970", "traceId": "f" * 32},
    )

    line = events.one()
    assert line["service"] == "payment-resource" and line["logger"] == "dlock.events"
    assert line["traceId"] == TRACE and line["ts"] != "1970" and line["level"] == "INFO"


def test_values_the_fast_encoder_refuses_still_give_the_event(events):
    logs.log_event("e", token=2**70, negative=-(2**64), text="\udcff", nested={"n": [2**65]})

    line = events.one()
    assert line["token"] == 2**70 and line["negative"] == -(2**64)
    assert line["text"] == "\udcff" and line["nested"] == {"n": [2**65]}


def test_nan_and_infinity_are_null_so_the_line_is_strict_json(events):
    logs.log_event("e", ratio=float("nan"), high=float("inf"), low=float("-inf"), ok=1.5)

    line = json.loads(events.raw, parse_constant=lambda c: pytest.fail(f"non-JSON {c}"))
    assert (line["ratio"], line["high"], line["low"], line["ok"]) == (None, None, None, 1.5)


@dataclasses.dataclass
class _Point:
    x: int
    when: dt.date


class _Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("no str")

    def __repr__(self) -> str:
        raise RuntimeError("no repr")


def test_every_other_value_is_written_rather_than_dropping_the_line(events):
    logs.log_event(
        "e",
        amount=decimal.Decimal("10.50"),
        error=ValueError("boom"),
        kind=ValueError,
        point=_Point(1, dt.date(2026, 12, 2)),
        tags={"a"},
        pair=(1, "two"),
        odd=_Unprintable(),
        keys={1: "int key", None: "none key"},
    )

    line = events.one()
    assert line["amount"] == "10.50"
    assert line["error"] == "ValueError: boom" and line["kind"] == "ValueError"
    assert line["point"] == {"x": 1, "when": "2026-12-02"}
    assert line["tags"] == "{'a'}" and line["pair"] == [1, "two"]
    assert line["odd"] == "__could_not_encode__"
    assert line["keys"] == {"1": "int key", "null": "none key"}


def test_a_large_value_is_written_whole(events):
    # dlock does not truncate: bodies are bounded (DLOCK_MAX_BODY_BYTES) before anything logs.
    value = "x" * (64 * 1024)

    logs.log_event("e", body=value)

    assert events.one()["body"] == value


def test_an_exception_is_one_line_with_its_traceback_and_no_secret(events):
    credential = "dlk_secret_credential_value"
    request = RequestFactory().post(
        "/v1/payouts/p/claim?limit=1",
        data=b"{}",
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {credential}",
    )

    def view(bearer: str) -> None:
        raise RuntimeError("database said no\nsecond line")

    try:
        view(credential)
    except RuntimeError:
        logging.getLogger("dlock.handlers").exception(
            "unhandled exception", extra={"event": "unhandled_exception", "request": request}
        )

    assert events.raw.count("\n") == 1
    assert credential not in events.raw  # locals are not rendered, nor the request's headers
    line = events.one()
    assert line["event"] == "unhandled_exception" and line["level"] == "ERROR"
    assert line["exc_info"].startswith("Traceback (most recent call last):")
    assert "RuntimeError: database said no\nsecond line" in line["exc_info"]
    assert line["request"] == "<WSGIRequest: POST '/v1/payouts/p/claim?limit=1'>"


def test_log_event_filters_by_level_as_logger_log_does(events):
    logger = logging.getLogger("dlock.events")
    logger.setLevel(logging.WARNING)

    logs.log_event("quiet", level=logging.INFO, x=1)
    assert events.raw == "" and not logs.event_enabled(logging.INFO)
    logs.log_event("loud", level=logging.WARNING, x=1)
    assert [line["event"] for line in events.parsed()] == ["loud"]
    logger.disabled = True
    logs.log_event("off", level=logging.ERROR)
    assert len(events.parsed()) == 1
    with pytest.raises(TypeError):
        logs.log_event("bad level", level="INFO")  # type: ignore[arg-type]


def test_log_event_refuses_a_field_named_like_a_record_attribute(events):
    for name in ("message", "exc_info", "asctime", "lineno"):
        with pytest.raises(KeyError):
            logs.log_event("x", **{name: 1})
    assert events.raw == ""


def test_a_role_writes_one_json_object_per_line_on_stdout():
    # The roles' LOGGING (settings.base.logging_config) in a process of its own, whose stdout
    # takes ASCII only: every line is ASCII, so no locale can make an event unwritable.
    script = (
        "import django, logging; django.setup();"
        "from dlock.logs import log_event;"
        "log_event('lock_acquired', key='ü\\n\"', fencingToken=2**70);"
        "logging.getLogger('django').warning('from django')"
    )
    env = {
        **os.environ,
        "ROLE": "executor",
        "DJANGO_SETTINGS_MODULE": "settings.executor",
        "DLOCK_LOG_LEVEL": "INFO",
        "PYTHONIOENCODING": "ascii:strict",
    }
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        timeout=120,
        check=True,
    )

    assert b"Logging error" not in done.stderr
    lines = [json.loads(raw) for raw in (done.stdout + done.stderr).decode("ascii").splitlines()]
    by_event = {line["event"]: line for line in lines}
    assert by_event["lock_acquired"]["key"] == 'ü\n"'
    assert by_event["lock_acquired"]["fencingToken"] == 2**70
    assert by_event["lock_acquired"]["service"] == "executor"
    assert by_event["log"]["message"] == "from django"
