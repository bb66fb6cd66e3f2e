"""One HTTP exchange for dlock's own hops: budgeted timeouts, trace and owner headers, no retries.

Retries are the caller's decision (`dlock.client.RetryPolicy`, or an explicit loop that reads
`dlock.budgets`). This module never re-sends a request: urllib3's own retries are switched off,
so a POST is presented at most once per call.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any

import requests
from requests.adapters import HTTPAdapter
from urllib3.exceptions import NewConnectionError
from urllib3.util.retry import Retry

from dlock.budgets import Budget
from dlock.tracing import traceparent


class TransportError(Exception):
    """No HTTP response: `sent` is False only when nothing can have reached the server."""

    def __init__(self, method: str, url: str, *, sent: bool, cause: BaseException) -> None:
        self.method = method
        self.url = url
        self.sent = sent
        self.cause = cause
        what = "read failed after sending" if sent else "could not connect"
        super().__init__(f"{method} {url}: {what}: {cause.__class__.__name__}: {cause}")


@dataclass
class Reply:
    """A received HTTP response: status, parsed JSON body (or None) and headers."""

    status: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


def new_session() -> requests.Session:
    """A requests session whose adapters never retry (a POST is presented at most once)."""
    session = requests.Session()
    adapter = HTTPAdapter(max_retries=Retry(total=0, connect=0, read=0, redirect=0, status=0))
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


_local = threading.local()


def thread_session() -> requests.Session:
    """One pooled session per thread (requests sessions are not thread-safe)."""
    session = getattr(_local, "session", None)
    if session is None:
        session = _local.session = new_session()
    return session


def _nothing_sent(exc: requests.RequestException) -> bool:
    if isinstance(exc, requests.ConnectTimeout):
        return True
    if isinstance(exc, requests.ConnectionError):
        reason = exc.args[0] if exc.args else None
        inner = getattr(reason, "reason", reason)
        return isinstance(inner, (NewConnectionError, ConnectionRefusedError))
    return False


def exchange(
    method: str,
    url: str,
    *,
    hop: Budget,
    owner_id: str | None = None,
    json_body: Any = None,
    params: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
    read_timeout_s: float | None = None,
    trace_id: str | None = None,
    session: requests.Session | None = None,
) -> Reply:
    """Send one request within `hop`'s budget; raise TransportError when no response came."""
    sent_headers = {"Accept": "application/json", "traceparent": traceparent(trace_id)}
    if owner_id is not None:
        sent_headers["X-Owner-Id"] = owner_id
    if headers:
        sent_headers.update(headers)
    data = None
    if json_body is not None:
        data = json.dumps(json_body, separators=(",", ":")).encode()
        sent_headers["Content-Type"] = "application/json; charset=utf-8"
    timeout = (hop.connect_s, read_timeout_s if read_timeout_s is not None else hop.read_s)
    try:
        response = (session or thread_session()).request(
            method, url, data=data, params=params, headers=sent_headers, timeout=timeout
        )
    except requests.RequestException as exc:
        raise TransportError(method, url, sent=not _nothing_sent(exc), cause=exc) from exc
    body: Any = None
    if response.content:
        try:
            body = response.json()
        except ValueError:
            body = None
    return Reply(response.status_code, body, dict(response.headers))
