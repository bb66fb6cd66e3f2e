"""Admission control in front of Django: shed a request that waited too long to be served.

Before Django runs, a request waits in the proxy's upstream connection, gunicorn's accept queue,
its main loop and its thread pool's queue; no database deadline can see any of it, and under
overload it grows without bound (docs/CHANGELOG.md). The role's proxy stamps every request with
the time it took it, `X-Request-Start: t=<seconds.milliseconds>` (nginx's `$msec`; a client's
own copy is replaced, never passed on: deploy/nginx/nginx.conf.template); a request older than
SERVER_QUEUE_DEADLINE_MS when a worker thread picks it up has spent most of its caller's budget
(C3 3.8), so it is answered 503 OVERLOADED (retrySafe, retryAfterMillis, Retry-After) at once,
without entering Django: shedding must cost a small fraction of serving, or the work of refusing
becomes the overload. Probes and scrapes are never shed. Without the header (a role run bare,
the test client) nothing is shed.
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
from dlock.tracing import new_trace_id, trace_id_from_traceparent
from dlock.wire import MONITORING_PATHS, raw_json_headers


def queue_wait(stamp: str | None, now: float | None = None) -> float | None:
    """Seconds since the proxy's `t=<time>` stamp (None: absent or not one).

    nginx's `$msec` is seconds with a millisecond fraction (`t=1764662400.123`); other proxies
    stamp integer milliseconds or microseconds since the epoch (the header's other common
    spellings). The unit is told by magnitude, as every reader of this header does: a value past
    1e14 is microseconds, past 1e11 milliseconds, else seconds."""
    if not stamp or not stamp.startswith("t="):
        return None
    try:
        started = float(stamp[2:])
    except ValueError:
        return None
    if started != started or started <= 0 or started == float("inf"):  # NaN, absurd
        return None
    if started > 1e14:
        started /= 1e6
    elif started > 1e11:
        started /= 1e3
    return (time.time() if now is None else now) - started


class AdmissionControl:
    def __init__(self, app: Callable, *, deadline_ms: int | None = None) -> None:
        self.app = app
        self.deadline_ms = deadline_ms or settings.SERVER_QUEUE_DEADLINE_MS
        self._shed_since_report = 0
        self._last_report = 0.0

    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        waited = queue_wait(environ.get("HTTP_X_REQUEST_START"))
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
            f"request waited {round(waited * 1000)} ms after the proxy took it before a worker "
            f"thread did (queue "
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
