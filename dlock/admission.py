"""Admission control in front of Django: shed a request that waited too long to be served.

Before Django runs, a request waits in its socket buffer for the worker's main loop and then in
the thread pool's queue; no database deadline can see either, and under overload they grow
without bound (a 2x open-loop run measured 12 s medians and client timeouts). `dlock.serving`
measures the time since the request arrived; one older than SERVER_QUEUE_DEADLINE_MS has spent
most of its caller's
budget (C3 3.8), so it is answered 503 OVERLOADED (retrySafe, retryAfterMillis, Retry-After) at
once, without entering Django: shedding must cost a small fraction of serving, or the work of
refusing becomes the overload (measured in docs/benchmarks.md). Probes and scrapes are never shed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from django.conf import settings

from dlock import metrics
from dlock.errors import ApiError, Code
from dlock.handlers import envelope_headers
from dlock.logs import log_event
from dlock.serving import thread_queue_wait
from dlock.tracing import new_trace_id, trace_id_from_traceparent
from dlock.wire import MONITORING_PATHS, raw_json_headers


class AdmissionControl:
    def __init__(self, app: Callable, *, deadline_ms: int | None = None) -> None:
        self.app = app
        self.deadline_ms = deadline_ms or settings.SERVER_QUEUE_DEADLINE_MS
        self._shed_since_report = 0
        self._last_report = 0.0

    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        waited = thread_queue_wait()
        if (
            waited is None
            or waited * 1000 <= self.deadline_ms
            or environ.get("PATH_INFO") in MONITORING_PATHS
        ):
            return self.app(environ, start_response)
        return self._shed(environ, start_response, waited)

    def _shed(self, environ: dict, start_response: Callable, waited: float) -> list[bytes]:
        trace_id = trace_id_from_traceparent(environ.get("HTTP_TRACEPARENT")) or new_trace_id()
        error = ApiError(
            Code.OVERLOADED,
            f"request waited {round(waited * 1000)} ms before a worker thread took it (queue "
            f"deadline {self.deadline_ms} ms); nothing was done",
        )
        body = error.envelope_bytes(trace_id)
        headers = {**raw_json_headers(body), **envelope_headers(error)}
        start_response("503 Service Unavailable", list(headers.items()))
        metrics.requests_shed.inc()
        self._report(waited)
        return [body]

    def _report(self, waited: float) -> None:
        """One `requests_shed` event per second at most: a line per request would add load."""
        self._shed_since_report += 1  # unlocked: an approximate count is fine for a log line
        now = time.monotonic()
        if now - self._last_report >= 1.0:
            self._last_report = now
            count, self._shed_since_report = self._shed_since_report, 0
            log_event(
                "requests_shed",
                level=logging.WARNING,
                count=count,
                queuedMs=round(waited * 1000),
                deadlineMs=self.deadline_ms,
            )


def wsgi_application() -> AdmissionControl:
    """Django's WSGI application behind admission control (every gunicorn entry point)."""
    from django.core.wsgi import get_wsgi_application

    return AdmissionControl(get_wsgi_application())
