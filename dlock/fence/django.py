"""Django glue for the fence kit: a view decorator that verifies and hands the view its token,
and the C3 error envelope for the kit's refusals.

    from dlock.fence.django import fenced_view

    @fenced_view(key=lambda request, sku: f"stock:{sku}")
    def take(request, sku, *, fencing_token):
        ...  # fenced_update(..., token=fencing_token); FencedOut becomes 409 FENCED_OUT

Keys come from settings.DLOCK_FENCING_PUBLIC_KEYS (`kid:<public key>[,…]`, what `GET
/v1/fencing-keys` publishes and `manage.py fencing_keys --public` prints); a bad value fails
loudly at the first request. One verifier per distinct value: tests may override the setting.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connections
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from dlock.errors import ApiError
from dlock.fence.proofs import KeyFormatError, PublicKeys, Verifier, verified_token
from dlock.tracing import current_trace_id

SETTING = "DLOCK_FENCING_PUBLIC_KEYS"


@functools.lru_cache(maxsize=8)
def verifier_for(keys: PublicKeys) -> Verifier:
    """One Verifier (and its memory of verified proofs) per key set in this process."""
    return Verifier(keys)


def settings_verifier() -> Verifier:
    """The verifier for settings.DLOCK_FENCING_PUBLIC_KEYS (a string or a PublicKeys)."""
    configured = getattr(settings, SETTING, "")
    if isinstance(configured, str):
        try:
            configured = PublicKeys.parse(configured, setting=SETTING)
        except KeyFormatError as exc:
            raise ImproperlyConfigured(str(exc)) from None
    if not configured:
        raise ImproperlyConfigured(f"{SETTING} must name the lock server's public keys")
    return verifier_for(configured)


def error_response(error: ApiError) -> HttpResponse:
    """The C3 envelope of `error` (code, message, retrySafe, details, traceId) at its status."""
    response = JsonResponse(error.envelope(current_trace_id()), status=error.status)
    for name, value in error.headers.items():
        response[name] = value
    return response


def fenced_view(
    *, key: Callable[..., str], verifier: Callable[[], Verifier] = settings_verifier
) -> Callable[[Callable[..., HttpResponse]], Callable[..., HttpResponse]]:
    """Verify X-Fencing-Token and X-Fencing-Proof for the key `key(request, *args, **kwargs)`,
    then call the view with `fencing_token=<token>`. A refusal (400 INVALID_TOKEN, 409
    FENCED_OUT, any ApiError) is answered with the C3 envelope; the view's own transaction
    rolls back, an enclosing one (ATOMIC_REQUESTS) is marked to. Exempt from Django's CSRF
    check: the caller is a worker, and the proof is a header no other site can make a browser
    send."""

    def decorate(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        @functools.wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            try:
                token = verified_token(
                    request.headers, key=key(request, *args, **kwargs), verifier=verifier()
                )
                return view(request, *args, fencing_token=token, **kwargs)
            except ApiError as error:
                # Answered, not raised: an enclosing atomic block must still roll back (as DRF's).
                for connection in connections.all(initialized_only=True):
                    if connection.in_atomic_block:
                        connection.set_rollback(True)
                return error_response(error)

        return csrf_exempt(wrapper)

    return decorate
