"""JSON logs, one object per line, each with `event`, `service` and `traceId`."""

from __future__ import annotations

import logging
from typing import Any

from pythonjsonlogger.json import JsonFormatter as _BaseJsonFormatter

from dlock.tracing import current_trace_id

_logger = logging.getLogger("dlock.events")


class JsonFormatter(_BaseJsonFormatter):
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


def event_enabled(level: int = logging.INFO) -> bool:
    """Whether `log_event` at `level` would emit anything: a hot path skips building an event's
    fields (timestamps, ids as text) when it would not."""
    return _logger.isEnabledFor(level)


def log_event(event: str, *, level: int = logging.INFO, **fields: Any) -> None:
    """Emit one structured event; `fields` become top-level keys of the JSON line."""
    _logger.log(level, event, extra={"event": event, **fields})
