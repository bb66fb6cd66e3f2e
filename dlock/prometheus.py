"""django-prometheus' request middlewares, extended the way its documentation offers (a
`Metrics` subclass as the middlewares' `metrics_cls`, the middlewares subclassed), so that a
request updates only the request series dlock reads.

django-prometheus' own pair makes about a dozen metric updates per request (three histograms
among them) for some twenty series; the dashboard, the alerts, the runbooks and the tests read
four. These keep those four — same names, labels and buckets, updated by django-prometheus'
own code paths (`label_metric`, `_method`, `_get_view_name`) — and the exception series, which
cost nothing on a request that raises nothing:

* `django_http_requests_before_middlewares_total` (every request, before anything refuses it);
* `django_http_requests_total_by_method_total{method}`;
* `django_http_requests_latency_seconds_by_view_method{view,method}` (the latency panel);
* `django_http_responses_total_by_status_view_method_total{status,view,method}` (error rate);
* `django_http_exceptions_total_by_type{type}`, `…_by_view{view}` and
  `django_http_requests_unknown_latency_total`.

The other series are not made, so /metrics (one worker or several) shows no counters that would
never move. Measured: docs/performance.md, "What limits each
number".
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from django_prometheus.middleware import (
    Metrics,
    PrometheusAfterMiddleware,
    PrometheusBeforeMiddleware,
)
from django_prometheus.utils import Time, TimeSince

EXPORTED = frozenset(
    {
        "django_http_requests_before_middlewares_total",
        "django_http_requests_total_by_method",
        "django_http_requests_latency_seconds_by_view_method",
        "django_http_responses_total_by_status_view_method",
        "django_http_exceptions_total_by_type",
        "django_http_exceptions_total_by_view",
        "django_http_requests_unknown_latency_total",
    }
)


class RequestMetrics(Metrics):
    """django-prometheus' request metrics; only the EXPORTED ones are made. (A metric made but
    not registered would still be written to, and exported from, prometheus_client's
    multiprocess files with several workers.) No code path left in the middlewares below
    touches the others."""

    _instance = None  # its own singleton, not the stock class's

    def register_metric(
        self, metric_cls: Any, name: str, documentation: str, labelnames: Any = (), **kwargs: Any
    ) -> Any:
        if name not in EXPORTED:
            return None
        return super().register_metric(metric_cls, name, documentation, labelnames, **kwargs)


class BeforeMiddleware(PrometheusBeforeMiddleware):
    """First in MIDDLEWARE: counts every request, whatever answers it."""

    metrics_cls = RequestMetrics

    def process_request(self, request: HttpRequest) -> None:
        self.metrics.requests_total.inc()

    def process_response(self, request: HttpRequest, response: HttpResponse) -> HttpResponse:
        return response


class AfterMiddleware(PrometheusAfterMiddleware):
    """Last in MIDDLEWARE: requests by method, and by view, method and status with latency."""

    metrics_cls = RequestMetrics

    def process_request(self, request: HttpRequest) -> None:
        method = self._method(request)
        self.label_metric(self.metrics.requests_by_method, request, method=method).inc()
        request.prometheus_after_middleware_event = Time()  # type: ignore[attr-defined]

    def process_view(self, request: HttpRequest, *args: Any, **kwargs: Any) -> None:
        return None

    def process_template_response(
        self, request: HttpRequest, response: HttpResponse
    ) -> HttpResponse:
        return response

    def process_response(self, request: HttpRequest, response: HttpResponse) -> HttpResponse:
        method = self._method(request)
        name = self._get_view_name(request)
        self.label_metric(
            self.metrics.responses_by_status_view_method,
            request,
            response,
            status=str(response.status_code),
            view=name,
            method=method,
        ).inc()
        started = getattr(request, "prometheus_after_middleware_event", None)
        if started is None:
            self.label_metric(self.metrics.requests_unknown_latency, request, response).inc()
        else:
            self.label_metric(
                self.metrics.requests_latency_by_view_method,
                request,
                response,
                view=name,
                method=request.method,
            ).observe(TimeSince(started))
        return response
