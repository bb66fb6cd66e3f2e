"""JSON logs, one object per line, each with `event`, `service` and `traceId`.

Every acquire, release, claim, post and rail call emits one event, so emitting one is on the
hot path (issue 18). `JsonFormatter.format` builds the line without python-json-logger's
generic machinery (field parsing, renames, defaults, a scan of every LogRecord attribute, a
`json.dumps` that builds its encoder per call) and feeds the same dict, in the same key order,
to the same C encoder with the same options and the same `default` hook (JsonEncoder's), so
the line is the one python-json-logger writes, byte for byte; a record with exception or
stack information, a dict message, or a formatter configured differently takes
python-json-logger's own path. tests/test_logs.py proves the two agree.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from datetime import UTC, datetime
from json import encoder as _json_encoder
from typing import Any

import orjson
from pythonjsonlogger.core import BaseJsonFormatter
from pythonjsonlogger.json import JsonEncoder
from pythonjsonlogger.json import JsonFormatter as _BaseJsonFormatter

from dlock.tracing import current_trace_id

_logger = logging.getLogger("dlock.events")

_FIELDS = "%(levelname)s %(name)s %(message)s"
# The attributes every LogRecord has, in the order LogRecord.__init__ sets them: a record whose
# keys start with exactly these has its extras (and `message`, once formatted) after them.
_RECORD_HEAD = list(logging.LogRecord("", logging.INFO, "", 0, "", (), None).__dict__)
_c_make_encoder = _json_encoder.c_make_encoder  # type: ignore[attr-defined]  # untyped C accelerator
_c_encode_ascii = _json_encoder.c_encode_basestring_ascii  # type: ignore[attr-defined]


_FLAT = frozenset({str, int, bool, type(None)})


def _flat_line(log: dict[str, Any]) -> str | None:
    """json.dumps(log) for a dict of str, int, bool and None values, from orjson: indented,
    its only raw newlines are the ones between items (a newline in a string is escaped), so
    joining the items with ", " gives json.dumps' separators. Where the bytes could differ
    (non-ASCII text, which json escapes, any other escape, DEL; an int beyond 64 bits, which
    orjson refuses) None: the caller uses json's encoder."""
    try:
        out = orjson.dumps(log, option=orjson.OPT_INDENT_2)
    except orjson.JSONEncodeError:
        return None
    if not out.isascii() or b"\\" in out or b"\x7f" in out:
        return None
    return "{" + out[4:-2].replace(b",\n  ", b", ").decode() + "}"


def _iso_prefix(second: int) -> str:
    utc = time.gmtime(second)
    return (
        f"{utc.tm_year:04d}-{utc.tm_mon:02d}-{utc.tm_mday:02d}"
        f"T{utc.tm_hour:02d}:{utc.tm_min:02d}:{utc.tm_sec:02d}"
    )


class JsonFormatter(_BaseJsonFormatter):
    def __init__(self, *args: Any, service: str = "dlock", **kwargs: Any) -> None:
        kwargs.setdefault("timestamp", "ts")
        super().__init__(_FIELDS, *args, **kwargs)
        self.service = service
        self._json = JsonEncoder()
        self._second: tuple[int, str] = (-1, "")
        cls = type(self)
        self._fast = (
            _c_make_encoder is not None
            and _c_encode_ascii is not None
            and self.timestamp == "ts"
            and self._required_fields == ["levelname", "name", "message"]
            and not (self.prefix or self.rename_fields or self.static_fields or self.defaults)
            and not self.rename_fields_keep_missing
            and self.json_serializer is json.dumps
            and self.json_encoder is JsonEncoder
            and self.json_default is None
            and self.json_indent is None
            and self.json_ensure_ascii is True
            and set(_RECORD_HEAD) <= self._skip_fields
            and cls.add_fields is JsonFormatter.add_fields
            and cls.process_log_record is BaseJsonFormatter.process_log_record
            and cls.jsonify_log_record is _BaseJsonFormatter.jsonify_log_record
            and cls.serialize_log_record is BaseJsonFormatter.serialize_log_record
        )

    def add_fields(self, log_record: dict, record: logging.LogRecord, message_dict: dict) -> None:
        super().add_fields(log_record, record, message_dict)
        log_record["service"] = self.service
        log_record.setdefault("event", getattr(record, "event", None) or "log")
        log_record.setdefault("traceId", current_trace_id())
        log_record["level"] = log_record.pop("levelname", record.levelname)
        log_record["logger"] = log_record.pop("name", record.name)

    def format(self, record: logging.LogRecord) -> str:
        if (
            not self._fast
            or record.exc_info
            or record.exc_text
            or record.stack_info
            or isinstance(record.msg, dict)
        ):
            return super().format(record)
        message = record.getMessage()
        record.message = message
        # What add_fields above makes after python-json-logger's: message, the record's extras
        # in attribute order (reserved and _private names skipped), then ts, service, event,
        # traceId, level, logger (each replacing an extra of that name where it stands).
        log: dict[str, Any] = {"message": message}
        attrs = record.__dict__
        keys = list(attrs)
        if keys[: len(_RECORD_HEAD)] == _RECORD_HEAD:
            keys = keys[len(_RECORD_HEAD) :]
        skip = self._skip_fields
        flat = True  # every value a str, int, bool or None: orjson can write the line
        for key in keys:
            if key in skip:
                continue
            if type(key) is not str:
                return super().format(record)
            if key[:1] != "_":
                value = attrs[key]
                log[key] = value
                if flat and type(value) not in _FLAT:
                    flat = False
        log["ts"] = self._timestamp(record.created)
        log["service"] = self.service
        event = log.setdefault("event", getattr(record, "event", None) or "log")
        trace_id = log.setdefault("traceId", current_trace_id())
        log["level"] = record.levelname
        log["logger"] = record.name
        if flat and type(event) in _FLAT and type(trace_id) in _FLAT:
            line = _flat_line(log)
            if line is not None:
                return line
        # json.dumps(log, cls=JsonEncoder) without building the encoder object per call: the
        # same C encoder, options and default hook that JsonEncoder.iterencode passes it.
        encode = _c_make_encoder(
            {}, self._json.default, _c_encode_ascii, None, ": ", ", ", False, False, True
        )
        return "".join(encode(log, 0))

    def _timestamp(self, created: float) -> str:
        """datetime.fromtimestamp(created, timezone.utc).isoformat(), which is what
        JsonEncoder writes for the `ts` datetime python-json-logger adds; the date and time
        of day are kept per second."""
        if not (0 <= created < 253402300000):  # outside years 1970..9999: datetime's own
            return datetime.fromtimestamp(created, tz=UTC).isoformat()
        fraction, whole = math.modf(created)
        micros = round(fraction * 1e6)  # half to even, as datetime.fromtimestamp rounds
        second = int(whole)
        if micros >= 1_000_000:
            micros -= 1_000_000
            second += 1
        cached = self._second
        if cached[0] != second:
            cached = (second, _iso_prefix(second))
            self._second = cached
        if micros:
            return f"{cached[1]}.{micros:06d}+00:00"
        return f"{cached[1]}+00:00"


def event_enabled(level: int = logging.INFO) -> bool:
    """Whether `log_event` at `level` would emit anything: a hot path skips building an event's
    fields (timestamps, ids as text) when it would not."""
    return _logger.isEnabledFor(level)


def log_event(event: str, *, level: int = logging.INFO, **fields: Any) -> None:
    """Emit one structured event; `fields` become top-level keys of the JSON line.

    Logger.log's steps for this call, minus its walk up the stack for the caller (the caller
    it finds is always this function): nothing is built when the level is off."""
    if not isinstance(level, int):
        _logger.log(level, event, extra={"event": event, **fields})  # its TypeError
        return
    if not _logger.isEnabledFor(level):
        return
    here = sys._getframe()
    record = _logger.makeRecord(
        _logger.name,
        level,
        here.f_code.co_filename,
        here.f_lineno,
        event,
        (),
        None,
        "log_event",
        {"event": event, **fields},
    )
    _logger.handle(record)
