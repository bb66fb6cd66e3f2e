"""The hot-path body checks of L4/L6 accept exactly what their serializers accept, and yield
the same result; everything else is refused by the serializer itself (same code and details)."""

from __future__ import annotations

import pytest
from rest_framework.exceptions import ValidationError

from lockserver.views import (
    AcquireInput,
    ReleaseInput,
    _parse,
    _parse_acquire,
    _parse_release,
)

SID = "0b4f8f0e-6a0e-4c1e-9c1e-3f1f0f7f7a01"
BODIES = [
    {"sessionId": SID},
    {"sessionId": f"  {SID}  "},
    {"sessionId": SID, "ttlMillis": 1_000, "waitMillis": 0},
    {"sessionId": SID, "ttlMillis": 60_000, "waitMillis": 30_000},
    {"sessionId": SID, "ttlMillis": 999},
    {"sessionId": SID, "ttlMillis": 60_001},
    {"sessionId": SID, "waitMillis": 30_001},
    {"sessionId": SID, "waitMillis": -1},
    {"sessionId": SID, "ttlMillis": "5000"},
    {"sessionId": SID, "ttlMillis": 5000.0},
    {"sessionId": SID, "ttlMillis": True},
    {"sessionId": SID, "ttlMillis": None},
    {"sessionId": 5},
    {"sessionId": ""},
    {"sessionId": "   "},
    {"sessionId": "a\x00b"},
    {"sessionId": "ключ"},
    {"sessionId": None},
    {"sessionId": SID, "extra": 1},
    {"ttlMillis": 5000},
    {},
    [],
    "text",
]


def outcome(parse, *args):
    try:
        return ("ok", dict(parse(*args)))
    except ValidationError as exc:
        return ("refused", exc.detail)


@pytest.mark.parametrize("body", BODIES, ids=repr)
def test_acquire_fast_path_matches_the_serializer(body):
    assert outcome(_parse_acquire, body) == outcome(_parse, AcquireInput, body)


@pytest.mark.parametrize("body", [*BODIES, {"sessionId": SID}], ids=repr)
def test_release_fast_path_matches_the_serializer(body):
    assert outcome(_parse_release, body) == outcome(_parse, ReleaseInput, body)


QUERIES = [
    "",
    f"sessionId={SID}",
    f"sessionId={SID.upper()}",
    "sessionId=",
    "sessionId",
    "sessionid=" + SID,
    f"sessionId={SID}&sessionId=other",
    f"sessionId=other&sessionId={SID}",
    f"sessionId={SID}&x=1",
    f"x=1&sessionId={SID}",
    f"sessionId={SID}%00",
    "sessionId=%41%42",
    "sessionId=a+b",
    f"sessionId={SID};x=1",
    f"sessionId={SID}#frag",
    f"sessionId=%20{SID}",
    "sessionId=" + "ключ".encode().decode("latin-1"),  # as a WSGI server passes raw UTF-8
    "=",
    "&",
    f"&sessionId={SID}",
]


@pytest.mark.parametrize("query", QUERIES, ids=repr)
def test_release_query_fast_path_matches_request_get(rf, query):
    """L6's sessionId from the query string: what request.GET.get("sessionId") yields."""
    from lockserver.views import _query_session_id

    request = rf.delete("/v1/locks/k", QUERY_STRING=query)
    assert _query_session_id(request) == request.GET.get("sessionId")
