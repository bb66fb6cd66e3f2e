"""JSON out, always with `charset=utf-8`; an unsatisfiable Accept still gets JSON, never 406."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from django.http import HttpResponse
from rest_framework import renderers
from rest_framework.negotiation import DefaultContentNegotiation

from dlock.wire import JSON_CONTENT_TYPE

if TYPE_CHECKING:
    from collections.abc import Sequence

    from rest_framework.renderers import BaseRenderer
    from rest_framework.request import Request
    from rest_framework.views import APIView

__all__ = ["BrowsableAPIRenderer", "JSONRenderer", "json_response"]


class JSONRenderer(renderers.JSONRenderer):
    charset = "utf-8"


class BrowsableAPIRenderer(renderers.BrowsableAPIRenderer):
    """Browsable API for humans on GET endpoints; errors are rendered by dlock.handlers as JSON.

    Read-only: no forms (a form would invite a write without the fencing headers), and it is
    offered only to GET/HEAD requests (see LenientNegotiation).
    """

    def show_form_for_method(
        self, view: APIView, method: str, request: Request, obj: object
    ) -> bool:
        return False

    def get_rendered_html_form(
        self, data: object, view: APIView, method: str, request: Request
    ) -> None:
        return None


SAFE_METHODS = ("GET", "HEAD")


class LenientNegotiation(DefaultContentNegotiation):
    # DRF passes the view's renderer list; this override indexes it, hence Sequence.
    def select_renderer(  # type: ignore[override]
        self,
        request: Request,
        renderers: Sequence[BaseRenderer],
        format_suffix: str | None = None,
    ) -> tuple[BaseRenderer, str]:
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
