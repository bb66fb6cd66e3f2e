"""JSON logs, one object per line, each with `event`, `service` and `traceId`.

The line is python-json-logger's (`pythonjsonlogger.orjson.OrjsonFormatter`, configured, not
copied): `rename_fields` turns `levelname`/`name` into `level`/`logger`, `static_fields` adds
`service`, `defaults` gives a record without an `event` (Django's, gunicorn's) `event: "log"`,
`timestamp` adds `ts`, and `add_fields` adds the request's `traceId` (dlock.tracing), which
changes per call. Every line is ASCII: orjson writes it (quotes, backslashes, newlines and
every other control character escaped, NaN and infinities as null) when its output is ASCII,
which a typical event is; otherwise, or when orjson refuses a value (an integer past 64 bits,
a lone surrogate such as text decoded from non-UTF-8 bytes with surrogateescape),
python-json-logger's standard-library encoder writes it with `ensure_ascii` (non-ASCII text
as \\u escapes). So a hostile string stays inside its value on one line, no event is lost to
its values, and a line never depends on the locale's encoding of stdout, nor splits at
U+2028 for a reader that splits lines as Python does. Values neither encoder has a type for
go through python-json-logger's defaults (bytes as base64, exceptions as `Type: message`,
enums as their value, the rest as `str()`).

Event names and their fields: ARCHITECTURE.md "Observability names", docs/operations.md.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import orjson
from pythonjsonlogger.core import RESERVED_ATTRS, LogData
from pythonjsonlogger.json import JsonEncoder
from pythonjsonlogger.orjson import OrjsonFormatter

from dlock.tracing import current_trace_id

_logger = logging.getLogger("dlock.events")

# No line carries where it was logged from or by which thread (the formatter leaves those record
# attributes out), so the records skip collecting them: the standard library's own switches
# (the logging HOWTO, "Optimization"). Finding the caller walked the stack on every record; with
# the thread and multiprocessing look-ups it was half of an event line's CPU (two lines per lock
# pair at INFO, docs/performance.md). `process` stays: gunicorn's own error log prints it.
logging._srcfile = None
logging.logThreads = False
logging.logMultiprocessing = False

# What every line carries, written by the formatter: an extra field of one of these names
# cannot replace it (a caller's `service=` or `level=` never forges the line's own).
_OWN_FIELDS = ("service", "level", "logger", "ts", "traceId")


class JsonFormatter(OrjsonFormatter):
    """python-json-logger's orjson formatter with dlock's fields (settings.base.logging_config)."""

    def __init__(self, *args: Any, service: str = "dlock", **kwargs: Any) -> None:
        kwargs.setdefault("timestamp", "ts")
        kwargs.setdefault("rename_fields", {"levelname": "level", "name": "logger"})
        kwargs["static_fields"] = {"service": service, **kwargs.get("static_fields", {})}
        kwargs["defaults"] = {"event": "log", **kwargs.get("defaults", {})}
        kwargs.setdefault("reserved_attrs", [*RESERVED_ATTRS, *_OWN_FIELDS])
        super().__init__(*(args or ("%(message)s %(levelname)s %(name)s",)), **kwargs)
        self.service = service

    def add_fields(
        self, log_data: dict[str, Any], record: logging.LogRecord, message_dict: dict[str, Any]
    ) -> None:
        super().add_fields(log_data, record, message_dict)
        log_data["traceId"] = current_trace_id()

    def jsonify_log_record(self, log_data: LogData) -> str:
        try:
            line = super().jsonify_log_record(log_data)
        except orjson.JSONEncodeError:  # a value orjson refuses; the standard library writes it
            line = ""
        if line and line.isascii():  # O(1) for a str
            return line
        return json.dumps(log_data, cls=JsonEncoder, ensure_ascii=True)


def event_enabled(level: int = logging.INFO) -> bool:
    """Whether `log_event` at `level` would emit anything: a hot path skips building an event's
    fields (timestamps, ids as text) when it would not."""
    return _logger.isEnabledFor(level)


def log_event(event: str, *, level: int = logging.INFO, **fields: Any) -> None:
    """Emit one structured event; `fields` become top-level keys of the JSON line. A field
    named like a LogRecord attribute (`message`, `exc_info`, ...) is a KeyError, as in
    Logger.log."""
    _logger.log(level, event, extra={"event": event, **fields}, stacklevel=2)


class Aggregate:
    """One event a second at most for something that happens per request under load or attack
    (a shed, a refused Host): `count` says how many it stands for. A line per occurrence
    would add load exactly when there is too much (dlock.admission does the same for sheds)."""

    def __init__(self, event: str, *, period_s: float = 1.0, level: int = logging.WARNING) -> None:
        self.event = event
        self.period_s = period_s
        self.level = level
        self._count = 0
        self._last = 0.0

    def add(self, **fields: Any) -> None:
        self._count += 1  # unlocked: an approximate count is fine for a log line
        now = time.monotonic()
        if now - self._last >= self.period_s:
            self._last = now
            count, self._count = self._count, 0
            _logger.log(
                self.level, self.event, extra={"event": self.event, "count": count, **fields}
            )


# A Host outside ALLOWED_HOSTS (dlock.middleware.refusal answers it; Django's own DisallowedHost
# log line, where a stock middleware raised it, is turned into this too): one line a second.
hosts_refused = Aggregate("host_refused")


class QuietRefusals(logging.Filter):
    """On `django.request` and `django.security.DisallowedHost` (settings.base.logging_config):
    a Host outside ALLOWED_HOSTS is a client's mistake, not an ERROR with a traceback, so it
    becomes the aggregated `host_refused` event; a 503/504 answer was already counted by the
    aggregated `dependency_failure` event (dlock.handlers), so Django's own line for it goes."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == "django.security.DisallowedHost":
            hosts_refused.add()
            return False
        return getattr(record, "status_code", None) not in (503, 504)
