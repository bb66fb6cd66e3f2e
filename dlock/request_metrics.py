"""The per-request HTTP metrics every server role exports, under django-prometheus' names.

They replace django-prometheus' two middlewares, which made about a dozen labelled updates per
request (3–6 % of each role's CPU, docs/benchmarks.md) for series nothing reads. Kept: the
names the dashboard, the alerts, the runbooks and the tests use, with the same labels and
buckets — `django_http_requests_before_middlewares_total`,
`django_http_requests_total_by_method_total{method}`,
`django_http_requests_latency_seconds_by_view_method{view,method}` and
`django_http_responses_total_by_status_view_method_total{status,view,method}` (the error rate).
Label values are chosen by the server: `method` is one of dlock.wire.KNOWN_METHODS or
"<invalid method>", `view` a route name or "<unnamed view>", `status` a status code. Labelled
children are cached per label tuple (a bounded set, see above), so a request makes four dict
lookups and four updates. They live in the default registry, so prometheus_client's multiprocess
mode (dlock.metrics.scrape_registry) sums them over gunicorn workers like every other series.
"""

from __future__ import annotations

from functools import cache

from prometheus_client import Counter, Histogram

# django-prometheus' PROMETHEUS_LATENCY_BUCKETS (the dashboard's quantiles were drawn on them).
LATENCY_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    25.0,
    50.0,
    75.0,
    float("inf"),
)

requests_before_middlewares = Counter(
    "django_http_requests_before_middlewares",
    "Total count of requests before middlewares run.",
)
_requests_by_method = Counter(
    "django_http_requests_total_by_method", "Count of requests by method.", ["method"]
)
_latency_by_view_method = Histogram(
    "django_http_requests_latency_seconds_by_view_method",
    "Histogram of request processing time labelled by view.",
    ["view", "method"],
    buckets=LATENCY_BUCKETS,
)
_responses_by_status_view_method = Counter(
    "django_http_responses_total_by_status_view_method",
    "Count of responses by status, view, method.",
    ["status", "view", "method"],
)


@cache
def requests_by_method(method: str) -> Counter:
    return _requests_by_method.labels(method=method)


@cache
def latency_by_view_method(view: str, method: str) -> Histogram:
    return _latency_by_view_method.labels(view=view, method=method)


@cache
def responses_by_status_view_method(status: str, view: str, method: str) -> Counter:
    return _responses_by_status_view_method.labels(status=status, view=view, method=method)
