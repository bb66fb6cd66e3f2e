"""Proof-bound fencing tokens (ARCHITECTURE decision 15): sign and verify `X-Fencing-Proof`.

The lock server signs every grant it hands out (L4, L5) with an HMAC-SHA256 over the lock key
and the token; every token-bearing call carries the proof beside the token, and its receiver
verifies it offline against the key it is about to touch (`payout:{accountId}` for payments and
the rail proxy, the path key for L5/L6). A token that was never granted for that key — forged,
guessed, read on L7, or granted for another key — opens nothing.

Wire form: `v1.<kid>.<mac>`, `mac` = unpadded base64url of HMAC-SHA256(secret[kid], message),
message = b"dlock-fencing-proof/v1\\n" + key + b"\\n" + decimal token. The key ring comes from
DLOCK_PROOF_KEYS (`kid:secret,kid2:secret2`): the first entry signs, every entry verifies, so a
rotation adds the new key in front, waits for every live grant to be renewed or expire, then drops
the old one (docs/operations.md "Rotating the fencing-proof keys").
"""

from __future__ import annotations

import base64
import hmac
import re
import uuid
from collections.abc import Callable

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest

from dlock.errors import ApiError, Code, not_found

HEADER = "X-Fencing-Proof"
_META_KEY = "HTTP_X_FENCING_PROOF"  # HEADER in request.META (what request.headers reads)
VERSION = "v1"
KID_MAX = 32
SECRET_MIN = 32
PROOF_MAX = 128
_KID = re.compile(r"[A-Za-z0-9_\-]{1,32}", re.ASCII)
# 32 MAC bytes are 43 unpadded base64url characters.
_PROOF = re.compile(r"v1\.([A-Za-z0-9_\-]{1,32})\.([A-Za-z0-9_\-]{43})", re.ASCII)
_DOMAIN = b"dlock-fencing-proof/v1\n"

KeyRing = tuple[tuple[str, bytes], ...]
# Only with DJANGO_DEBUG=true and no DLOCK_PROOF_KEYS; refused otherwise (settings/base.py).
DEV_PROOF_KEYS = "dev:dlock-development-only-proof-key-not-secret"
# The roles that sign or verify proofs: they refuse to start without a key ring.
PROOF_ROLES = frozenset({"lockserver", "payments", "railproxy"})


def parse_key_ring(raw: str, *, setting: str = "DLOCK_PROOF_KEYS") -> KeyRing:
    """`kid:secret[,kid:secret…]` → ((kid, secret bytes), …); the first signs. Empty → ()."""
    if raw.strip() == "":
        return ()
    ring: list[tuple[str, bytes]] = []
    for entry in (part.strip() for part in raw.split(",")):
        kid, sep, secret = entry.partition(":")
        if not sep or not _KID.fullmatch(kid):
            raise ImproperlyConfigured(
                f"{setting}: each entry must be kid:secret with kid 1…{KID_MAX} of "
                "[A-Za-z0-9_-] (e.g. k2026a:<random>,k2025b:<random>)"
            )
        if len(secret) < SECRET_MIN:
            raise ImproperlyConfigured(
                f"{setting}: the secret of kid {kid!r} must be at least {SECRET_MIN} characters"
            )
        if any(kid == known for known, _ in ring):
            raise ImproperlyConfigured(f"{setting}: kid {kid!r} appears twice")
        ring.append((kid, secret.encode()))
    return tuple(ring)


# Management commands that sign and verify nothing, so a process running one needs no ring: the
# migrate Job holds only database credentials (secrets where they are used, docs/security.md).
RING_FREE_COMMANDS = frozenset({"migrate"})


def check_configured(role: str, command: str | None = None) -> None:
    """Start-up check (dlock.apps): a role that signs or verifies proofs needs a key ring,
    unless the process only runs one of RING_FREE_COMMANDS (`manage.py <command>`)."""
    if command in RING_FREE_COMMANDS:
        return
    if role in PROOF_ROLES and not settings.DLOCK_PROOF_KEYS:
        raise ImproperlyConfigured(
            f"DLOCK_PROOF_KEYS must be set for the {role} role (kid:secret[,kid:secret…])"
        )


def _ring() -> KeyRing:
    ring = settings.DLOCK_PROOF_KEYS
    if not ring:
        raise ImproperlyConfigured("DLOCK_PROOF_KEYS must be set (kid:secret[,kid:secret…])")
    return ring


def _mac(secret: bytes, key: str, token: int) -> str:
    message = _DOMAIN + key.encode() + b"\n" + str(token).encode()
    digest = hmac.digest(secret, message, "sha256")
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def sign(*, key: str, token: int, ring: KeyRing | None = None) -> str:
    """The proof for (key, token), made with the first (signing) key of `ring`, by default
    the configured DLOCK_PROOF_KEYS (a tool outside Django passes its parsed ring)."""
    kid, secret = (ring or _ring())[0]
    return f"{VERSION}.{kid}.{_mac(secret, key, token)}"


def _invalid(reason: str, message: str) -> ApiError:
    return ApiError(Code.INVALID_TOKEN, message, details={"field": HEADER, "reason": reason})


def _parts(raw: str | None) -> tuple[str, str]:
    if raw is None or raw == "":
        raise _invalid("missing", f"{HEADER} is required with X-Fencing-Token")
    match = _PROOF.fullmatch(raw) if len(raw) <= PROOF_MAX else None
    if match is None:
        raise _invalid("malformed", f"{HEADER} must be v1.<kid>.<base64url HMAC-SHA256>")
    return match.group(1), match.group(2)


def presented(request: HttpRequest) -> str:
    """The request's X-Fencing-Proof, well-formed (else INVALID_TOKEN): checked before a receiver
    looks up which key to verify it against, so a missing proof costs no database work."""
    raw = request.META.get(_META_KEY) or ""
    _parts(raw)
    return raw


def verify(raw: str | None, *, key: str, token: int) -> None:
    """Raise 400 INVALID_TOKEN (details.reason: missing, malformed, unknown_kid, mismatch) unless
    `raw` is a proof this deployment issued for exactly (key, token)."""
    kid, presented_mac = _parts(raw)
    secret = dict(_ring()).get(kid)
    if secret is None:
        raise _invalid("unknown_kid", f"{HEADER} was signed with a key this server does not hold")
    # Constant time: the comparison must not tell a forger how many characters were right.
    if not hmac.compare_digest(_mac(secret, key, token), presented_mac):
        raise _invalid("mismatch", f"{HEADER} was not issued for this lock key and token")


def require(request: HttpRequest, *, key: str, token: int) -> None:
    """The request's X-Fencing-Proof must bind `token` to `key` (see `verify`)."""
    verify(request.META.get(_META_KEY), key=key, token=token)


def payout_key(account_id: str) -> str:
    """The lock key that guards an account's payouts: what payments and the rail proxy verify."""
    return f"payout:{account_id}"


def require_for_payout(
    request: HttpRequest,
    *,
    payout_id: uuid.UUID,
    token: int,
    account_of: Callable[[uuid.UUID], str | None],
) -> None:
    """The receivers' rule (payments P2/P3, rail submissions): a well-formed proof first (no
    database work for a missing one), then the payout's account as its owner stores it
    (`account_of`; 404 for an unknown payout), then the proof must bind `token` to
    `payout:{accountId}`."""
    raw = presented(request)
    account_id = account_of(payout_id)
    if account_id is None:
        raise not_found("payout", str(payout_id))
    verify(raw, key=payout_key(account_id), token=token)
