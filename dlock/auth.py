"""Caller credentials (ARCHITECTURE decision 14): who may call which `/v1` endpoint.

A credential is an opaque random string the caller sends as `Authorization: Bearer <credential>`
(or, from a browser, as the password of HTTP Basic; the user name is ignored). The server keeps
only SHA-256 hashes, from `DLOCK_CREDENTIALS`: comma-separated `scopes:sha256hex` entries, scopes
joined by `+` (`executor`, `operator`), e.g.
`executor:9f86…,operator:60303…,executor:2c26…` — several entries may be valid at once, which is
how a credential is rotated (add the new hash, move callers, drop the old one). A credential's
id is the first 12 hex digits of its hash: safe to log and to store with a session.

Missing or unknown credential: 401 UNAUTHENTICATED; known but without the endpoint's scope: 403
FORBIDDEN. The operator scope may also read payouts (GET P1, P4: `OPERATOR_READ_ROUTES`), so an
on-call can look at them with its own credential. Health, metrics, the schema and the docs
pages stay open (`OPEN_ROUTES`), and so does the lock server's `GET /v1/fencing-keys`
(public keys only). The middleware that applies this is
`dlock.middleware.ApiMiddleware`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING

from django.conf import settings

from dlock.errors import ApiError, Code

if TYPE_CHECKING:  # the client library imports this module: no Django HTTP machinery
    from django.http import HttpRequest

# settings.env.CREDENTIAL_SCOPES validates DLOCK_CREDENTIALS against the same names.
SCOPES = frozenset({"executor", "operator"})

# Route names (Django URL names) and the scope each needs; every other /v1 route needs executor.
OPERATOR_ROUTES = frozenset({"lock-revoke"})
# Reads an on-call needs (P1, P4): the operator scope may GET them too; writes stay executor-only.
OPERATOR_READ_ROUTES = frozenset({"payouts-list", "payout-detail"})
READ_METHODS = frozenset({"GET", "HEAD"})
# The lock server's public fencing keys carry no secret: open like the schema (decision 25).
OPEN_ROUTES = frozenset({"schema", "swagger-ui", "redoc", "fencing-keys"})
CREDENTIAL_ENV = {"executor": "DLOCK_EXECUTOR_CREDENTIAL", "operator": "DLOCK_OPERATOR_CREDENTIAL"}
CREDENTIAL_PREFIX = "dlk_"
CHALLENGE = 'Bearer realm="dlock", Basic realm="dlock"'


@dataclass(frozen=True)
class Principal:
    """An authenticated caller: the credential's id (hash prefix) and its scopes."""

    credential_id: str
    scopes: frozenset[str]


def credential_hash(credential: str) -> str:
    return hashlib.sha256(credential.encode("utf-8")).hexdigest()


def credential_id(credential: str) -> str:
    return credential_hash(credential)[:12]


def new_credential() -> str:
    """A fresh credential (256 bits of randomness)."""
    return CREDENTIAL_PREFIX + secrets.token_urlsafe(32)


def credentials_entry(credential: str, *scopes: str) -> str:
    """The `DLOCK_CREDENTIALS` entry for `credential` (what `make up` writes)."""
    return f"{'+'.join(scopes)}:{credential_hash(credential)}"


def presented_credential(request: HttpRequest) -> str | None:
    """The credential in `Authorization` (Bearer, or the password of Basic), or None."""
    raw = request.META.get("HTTP_AUTHORIZATION", "")
    kind, _, value = raw.partition(" ")
    kind = kind.lower()
    value = value.strip()
    if kind == "bearer" and value:
        return value
    if kind == "basic" and value:
        try:
            decoded = base64.b64decode(value, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return None
        password = decoded.partition(":")[2]
        return password or None
    return None


def authenticate(request: HttpRequest) -> Principal:
    credential = presented_credential(request)
    if credential is None:
        raise ApiError(Code.UNAUTHENTICATED, "Authorization: Bearer <credential> is required")
    digest = credential_hash(credential)
    scopes = None
    for known, known_scopes in settings.DLOCK_CREDENTIAL_HASHES.items():
        if hmac.compare_digest(known, digest):  # every entry compared: no early exit by prefix
            scopes = known_scopes
    if scopes is None:
        raise ApiError(Code.UNAUTHENTICATED, "unknown credential")
    return Principal(credential_id=digest[:12], scopes=scopes)


def required_scope(request: HttpRequest) -> str | None:
    """The scope the resolved route needs; None for what stays open."""
    if not request.path.startswith("/v1/"):
        return None
    match = request.resolver_match
    name = match.url_name if match is not None else None
    if name in OPEN_ROUTES:
        return None
    return "operator" if name in OPERATOR_ROUTES else "executor"


def permits(request: HttpRequest, principal: Principal, scope: str) -> bool:
    """Whether `principal` may call the route `required_scope` answered `scope` for."""
    if scope in principal.scopes:
        return True
    match = request.resolver_match
    return (
        "operator" in principal.scopes
        and request.method in READ_METHODS
        and match is not None
        and match.url_name in OPERATOR_READ_ROUTES
    )


def request_principal(request: HttpRequest) -> Principal:
    """The caller of a /v1 request (set by dlock.middleware.ApiMiddleware before the view runs)."""
    principal = getattr(request, "dlock_principal", None)
    if principal is None:  # a view reached without the middleware: fail closed
        raise ApiError(Code.UNAUTHENTICATED, "Authorization: Bearer <credential> is required")
    return principal


def authorization_header(scope: str = "executor") -> dict[str, str]:
    """The Authorization header a dlock caller sends, from DLOCK_EXECUTOR_CREDENTIAL or
    DLOCK_OPERATOR_CREDENTIAL; empty when the variable is unset (the server then answers 401)."""
    credential = os.environ.get(CREDENTIAL_ENV[scope], "")
    return {"Authorization": f"Bearer {credential}"} if credential else {}
