"""Plain Django views for the hot write endpoints (ARCHITECTURE decision 17).

A hot route (L4, L5, L6, P2, P3, rail submissions) is served by `hot_view(Reference, post=fn)`:
the methods given are answered by plain functions on Django's HttpRequest, without DRF's
Request wrapper, content negotiation, Response rendering and finalize step; every other method
(OPTIONS, HEAD, GET on L6/L7's path, a wrong method's 405) is handed to the DRF class itself, so
those answers are DRF's by construction. What DRF did for the hot method is redone here, each
step from the same source DRF used:

- the body: `json_body` applies DRF's parser selection (`media_type_matches`, so the same 415)
  and then `dlock.parsers.StrictJSONParser` itself (same VALIDATION_FAILED / 413 details; an
  empty body is `{}`, as DRF gives);
- failures: `dlock.handlers.drf_exception_handler`, DRF's EXCEPTION_HANDLER, so the envelope,
  its logs and Retry-After are the same; field-level details still come from the serializers;
- the answer: JSON in `JSON_CONTENT_TYPE` (what DRF's renderer sets), then the headers DRF's
  `finalize_response` adds to every answer of the class: `Allow` and `Vary: Accept`.

Authentication and scope (decision 14), traceId, security headers and the request metrics are
middleware and see the same route names, so they are unchanged. The schema generator
(drf-spectacular) reads `view.cls`, which is the DRF class: the OpenAPI description is the
DRF view's, byte for byte. tests/hotpath proves the wire behaviour identical, request by request.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import IO, Any

import orjson
from django.http import HttpRequest, HttpResponse
from django.utils.cache import patch_vary_headers
from rest_framework import exceptions as drf
from rest_framework.utils.mediatypes import media_type_matches
from rest_framework.views import APIView

from dlock.handlers import drf_exception_handler
from dlock.parsers import StrictJSONParser
from dlock.rendering import JSONRenderer
from dlock.wire import JSON_CONTENT_TYPE

__all__ = [
    "answer",
    "hot_read_view",
    "hot_view",
    "json_body",
    "negotiates_plain_json",
    "no_content",
]

Handler = Callable[..., HttpResponse]

_PARSER = StrictJSONParser()
_RENDERER = JSONRenderer()
# Content types DRF's media_type_matches(_PARSER.media_type, ...) accepts, as every dlock client
# sends them (C3's `application/json; charset=utf-8`): compared as strings, not parsed again.
# DRF's parse goes through the email package (docs/CHANGELOG.md); anything else still takes it.
_JSON_TYPES = frozenset((_PARSER.media_type, f"{_PARSER.media_type}; charset=utf-8"))


def json_body(request: HttpRequest) -> Any:
    """What DRF's `request.data` is for this request under DEFAULT_PARSER_CLASSES."""
    meta = request.META
    try:
        length = int(meta.get("CONTENT_LENGTH", meta.get("HTTP_CONTENT_LENGTH", 0)))
    except (ValueError, TypeError):
        length = 0
    if length == 0:  # DRF: no stream, so no parser and no media-type check
        return {}
    content_type = meta.get("CONTENT_TYPE", meta.get("HTTP_CONTENT_TYPE", ""))
    if content_type.lower() not in _JSON_TYPES and not media_type_matches(
        _PARSER.media_type, content_type
    ):
        raise drf.UnsupportedMediaType(content_type)
    # As DRF: read the request itself unless something has read it already.
    read_started = getattr(request, "_read_started", False)
    stream: IO[Any] = io.BytesIO(request.body) if read_started else request  # type: ignore[assignment]
    return _PARSER.parse(stream, content_type, None)


def _encode(data: object) -> bytes:
    """DRF's JSONRenderer output. orjson gives the same bytes for what our bodies hold (str,
    int, bool, None, lists, dicts) as long as nothing needs escaping: pure ASCII with no
    backslash; anything else (and an int beyond 64 bits) is left to DRF's renderer itself."""
    try:
        out = orjson.dumps(data)
    except TypeError:
        return _RENDERER.render(data)
    if out.isascii() and b"\\" not in out:
        return out
    return _RENDERER.render(data)


def answer(
    data: object,
    status: int = 200,
    headers: dict[str, str] | None = None,
    *,
    envelope: bool = False,
) -> HttpResponse:
    """A JSON answer as DRF's `Response(data, status, headers)` renders it. `envelope`: the body
    is already a C3 envelope (a replayed error), which the safety net must not wrap again."""
    response = HttpResponse(_encode(data), status=status, content_type=JSON_CONTENT_TYPE)
    if headers:
        for name, value in headers.items():
            response[name] = value
    if envelope:
        response.dlock_envelope = True  # type: ignore[attr-defined]  # read by the safety net
    return response


def no_content() -> HttpResponse:
    """204 as DRF renders `Response(status=204)`: no body, no Content-Type."""
    response = HttpResponse(status=204)
    del response["Content-Type"]
    return response


def _finalize_headers(reference: type[APIView]) -> tuple[str, bool]:
    """The Allow value and whether Vary: Accept is added, as DRF's finalize_response does for an
    instance of `reference` after Django's View.setup (which lends GET to HEAD)."""
    probe = reference()
    if hasattr(probe, "get") and not hasattr(probe, "head"):
        probe.head = probe.get  # type: ignore[attr-defined]
    return ", ".join(probe.allowed_methods), len(probe.renderer_classes) > 1


def hot_view(reference: type[APIView], **handlers: Handler) -> Handler:
    """A URL callback answering `handlers`' methods (e.g. post=fn) plainly and every other
    method through `reference`, the DRF class that stays the schema's source."""
    methods = {name.upper(): handler for name, handler in handlers.items()}
    unknown = set(methods) - {m.upper() for m in reference.http_method_names}
    if unknown or not all(hasattr(reference, m.lower()) for m in methods):
        raise TypeError(f"{reference.__name__} does not implement {sorted(methods)}")
    fallback = reference.as_view()
    allow, vary = _finalize_headers(reference)

    def view(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        handler = methods.get(request.method or "")
        if handler is None:
            return fallback(request, *args, **kwargs)
        try:
            response = handler(request, *args, **kwargs)
        except Exception as exc:  # what APIView.handle_exception hands to EXCEPTION_HANDLER
            response = drf_exception_handler(exc, {})
        if vary:
            if response.has_header("Vary"):
                patch_vary_headers(response, ("Accept",))
            else:  # what patch_vary_headers sets on an answer without Vary
                response.headers["Vary"] = "Accept"
        response["Allow"] = allow
        return response

    view.__name__ = view.__qualname__ = reference.__name__
    view.__module__ = reference.__module__
    view.__doc__ = reference.__doc__
    # drf-spectacular and Django's resolver see the DRF class (schema, view path, metrics).
    view.cls = reference  # type: ignore[attr-defined]
    view.initkwargs = {}  # type: ignore[attr-defined]
    view.view_class = reference  # type: ignore[attr-defined]
    view.view_initkwargs = {}  # type: ignore[attr-defined]
    view.csrf_exempt = True  # type: ignore[attr-defined]  # as APIView.as_view
    view.dlock_hot_methods = frozenset(methods)  # type: ignore[attr-defined]
    return view


# -- Plain reads (P1, P4): a machine's JSON GET plainly, everything else through DRF ----------
#
# Decision 17 keeps the browsable API on GET endpoints. DRF picks a renderer per request
# (dlock.rendering.LenientNegotiation): HTML for a browser, an indented JSON for
# `Accept: application/json; indent=4`, whatever `?format=` names. The plain view takes only
# the requests whose negotiation cannot end anywhere but compact JSON, and leaves every other
# one (and HEAD, OPTIONS, a wrong method) to the DRF class, whose answer it then is by
# construction.

# Accept values DRF answers with JSONRenderer and no media-type parameters (so no indent).
_PLAIN_JSON_ACCEPTS = frozenset({"application/json", "*/*", "application/*"})


def negotiates_plain_json(request: HttpRequest) -> bool:
    """Would DRF's negotiation give this GET compact JSON? (No Accept header is `*/*` to DRF;
    `format` is DRF's URL_FORMAT_OVERRIDE, which wins over Accept.)"""
    accept = request.META.get("HTTP_ACCEPT")
    if accept is not None and accept not in _PLAIN_JSON_ACCEPTS:
        return False
    return "format" not in request.GET


def hot_read_view(reference: type[APIView], *, get: Handler) -> Handler:
    """A URL callback answering a JSON GET with `get` (as hot_view does) and every other
    request, the browsable API's included, through `reference`."""
    plain = hot_view(reference, get=get)
    fallback = reference.as_view()

    def view(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if request.method == "GET" and negotiates_plain_json(request):
            return plain(request, *args, **kwargs)
        return fallback(request, *args, **kwargs)

    view.__dict__.update(plain.__dict__)  # cls, view_class, csrf_exempt, dlock_hot_methods
    view.__name__ = view.__qualname__ = plain.__name__
    view.__module__ = plain.__module__
    view.__doc__ = plain.__doc__
    return view
