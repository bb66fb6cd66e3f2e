"""JSON out, always with `charset=utf-8`; an unsatisfiable Accept still gets JSON, never 406."""

from __future__ import annotations

import json

from django.http import HttpResponse
from rest_framework import renderers
from rest_framework.negotiation import DefaultContentNegotiation

from dlock.wire import JSON_CONTENT_TYPE

__all__ = ["JSON_CONTENT_TYPE", "BrowsableAPIRenderer", "JSONRenderer", "json_response"]


class JSONRenderer(renderers.JSONRenderer):
    charset = "utf-8"


class BrowsableAPIRenderer(renderers.BrowsableAPIRenderer):
    """Browsable API for humans on GET endpoints; errors are rendered by dlock.handlers as JSON.

    Read-only: no forms (a form would invite a write without the fencing headers), and it is
    offered only to GET/HEAD requests (see LenientNegotiation).
    """

    def show_form_for_method(self, view, method, request, obj):
        return False

    def get_rendered_html_form(self, data, view, method, request):
        return None


SAFE_METHODS = ("GET", "HEAD")


class LenientNegotiation(DefaultContentNegotiation):
    def select_renderer(self, request, renderers, format_suffix=None):
        if request.method not in SAFE_METHODS:
            renderers = [r for r in renderers if r.format != "api"] or renderers
        try:
            return super().select_renderer(request, renderers, format_suffix)
        except Exception:  # NotAcceptable: a JSON API answers JSON rather than 406
            renderer = renderers[0]
            return renderer, renderer.media_type


def json_response(data: object, status: int = 200) -> HttpResponse:
    """A plain-Django JSON answer with the contract's content type (for non-DRF views)."""
    return HttpResponse(
        json.dumps(data, separators=(",", ":")), status=status, content_type=JSON_CONTENT_TYPE
    )
