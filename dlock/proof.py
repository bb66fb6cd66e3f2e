"""Fencing proofs in the roles (ARCHITECTURE decision 25): sign on the lock server, verify
everywhere else, with the key material from settings.

The format, the key sets and the verifier are the fence kit's (`dlock.fence`); this module
only binds them to the settings of a dlock role:

* `DLOCK_PROOF_KEYS` — the lock server's Ed25519 private keys, `kid:<key>[,kid:<key>…]`, the
  first signs, every one verifies. Only the lockserver role holds it (make up, k8s): a payment
  resource or rail proxy never signs, and in production refuses to start with it.
* `DLOCK_FENCING_PUBLIC_KEYS` — a verifier's public keys, `kid:<key>[,…]` (what
  `GET /v1/fencing-keys` publishes, in `manage.py fencing_keys`' form). Required by the
  payments and railproxy roles; the lock server derives its own from its private keys.

A rotation adds the new key in front (it signs from then on), waits for every live grant to
be renewed or expire, then drops the old one (docs/operations.md "Fencing-proof keys").
"""

from __future__ import annotations

import base64
import hashlib
import uuid
from collections.abc import Callable
from functools import lru_cache

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest

from dlock.errors import not_found
from dlock.fence.django import verifier_for
from dlock.fence.proofs import (
    PublicKeys,
    SigningKeys,
    Verifier,
    split,
)

_META_KEY = "HTTP_X_FENCING_PROOF"  # HEADER in request.META (what request.headers reads)
# Only with DJANGO_DEBUG=true and no keys configured; refused otherwise (settings/base.py). A
# fixed private key anyone can read: development proofs prove nothing.
DEV_KID = "dev"
DEV_PROOF_KEYS = (
    f"{DEV_KID}:"
    + base64.urlsafe_b64encode(hashlib.sha256(b"dlock-development-only-proof-key").digest())
    .rstrip(b"=")
    .decode()
)
SIGNING_ROLES = frozenset({"lockserver"})
VERIFYING_ROLES = frozenset({"payments", "railproxy"})
# The roles that sign or verify proofs: they refuse to start without their key material.
PROOF_ROLES = SIGNING_ROLES | VERIFYING_ROLES
# Management commands that sign and verify nothing, so a process running one needs no keys: the
# migrate Job holds only database credentials (secrets where they are used, docs/security.md);
# fencing_keys makes the first key (it refuses by itself what needs keys it was not given).
RING_FREE_COMMANDS = frozenset({"migrate", "fencing_keys"})


def parse_key_ring(raw: str, *, setting: str = "DLOCK_PROOF_KEYS") -> SigningKeys:
    """`kid:<private key>[,…]` → SigningKeys (the first signs); a bad value fails loudly."""
    try:
        return SigningKeys.parse(raw, setting=setting)
    except ValueError as exc:
        raise ImproperlyConfigured(str(exc)) from None


def parse_public_keys(raw: str, *, setting: str = "DLOCK_FENCING_PUBLIC_KEYS") -> PublicKeys:
    """`kid:<public key>[,…]` → PublicKeys; a bad value fails loudly."""
    try:
        return PublicKeys.parse(raw, setting=setting)
    except ValueError as exc:
        raise ImproperlyConfigured(str(exc)) from None


def check_configured(role: str, command: str | None = None) -> None:
    """Start-up check (dlock.apps): the lock server needs private keys; a verifier needs public
    keys, and in production must not hold private ones (elsewhere a harness that hands one
    environment to every role may leave them: the verifier then never signs, and checks with
    their public halves); unless the process only runs one of RING_FREE_COMMANDS."""
    if command in RING_FREE_COMMANDS:
        return
    if role in SIGNING_ROLES and not settings.DLOCK_PROOF_KEYS and not settings.DEBUG:
        raise ImproperlyConfigured(
            f"DLOCK_PROOF_KEYS must be set for the {role} role (kid:<Ed25519 private key>[,…]; "
            "manage.py fencing_keys --new <kid> makes one)"
        )
    if role in VERIFYING_ROLES:
        if settings.DLOCK_PROOF_KEYS and settings.DLOCK_ENVIRONMENT == "production":
            raise ImproperlyConfigured(
                f"DLOCK_PROOF_KEYS is the lock server's private key set; the {role} role "
                "verifies with DLOCK_FENCING_PUBLIC_KEYS only"
            )
        if not (settings.DLOCK_FENCING_PUBLIC_KEYS or settings.DLOCK_PROOF_KEYS or settings.DEBUG):
            raise ImproperlyConfigured(
                f"DLOCK_FENCING_PUBLIC_KEYS must be set for the {role} role "
                "(kid:<Ed25519 public key>[,…], as GET /v1/fencing-keys publishes them)"
            )


def signing_keys() -> SigningKeys:
    """The configured private keys (development: the fixed DEV key, DJANGO_DEBUG only). A
    verifying role never signs, whatever its environment holds."""
    if settings.ROLE in VERIFYING_ROLES:
        raise ImproperlyConfigured(f"the {settings.ROLE} role verifies proofs; it never signs")
    keys: SigningKeys = settings.DLOCK_PROOF_KEYS
    if keys:
        return keys
    if settings.DEBUG:
        return _dev_keys()
    raise ImproperlyConfigured("DLOCK_PROOF_KEYS must be set (kid:<Ed25519 private key>[,…])")


@lru_cache(maxsize=1)
def _dev_keys() -> SigningKeys:
    return SigningKeys.parse(DEV_PROOF_KEYS)


def public_keys() -> PublicKeys:
    """The keys this process verifies with: a verifier's DLOCK_FENCING_PUBLIC_KEYS; the lock
    server's own (the public halves of DLOCK_PROOF_KEYS, whatever a shared ConfigMap says);
    else the development key (DJANGO_DEBUG only)."""
    configured: PublicKeys = settings.DLOCK_FENCING_PUBLIC_KEYS
    own: SigningKeys = settings.DLOCK_PROOF_KEYS
    if own and (settings.ROLE not in VERIFYING_ROLES or not configured):
        return _public_of(own)
    if configured:
        return configured
    if settings.DEBUG:
        return _public_of(_dev_keys())
    raise ImproperlyConfigured("DLOCK_FENCING_PUBLIC_KEYS must be set (kid:<public key>[,…])")


@lru_cache(maxsize=4)
def _public_of(keys: SigningKeys) -> PublicKeys:
    return keys.public()


def verifier() -> Verifier:
    """This process's verifier for the configured keys (one per key set: a settings change, as
    in a test's override_settings, gets a fresh one and a fresh memory of verified proofs)."""
    return verifier_for(public_keys())


def sign(*, key: str, token: int, ring: SigningKeys | None = None) -> str:
    """The proof for (key, token), made with the first (newest) key of `ring`, by default the
    configured DLOCK_PROOF_KEYS (a tool outside Django passes its parsed keys). The lock
    server's own proofs are remembered as verified: its L5/L6 check of them is a lookup."""
    if ring is not None:
        return ring.sign(key=key, token=token)
    signed = signing_keys().sign(key=key, token=token)
    verifier().remember(signed, key=key, token=token)
    return signed


def presented(request: HttpRequest) -> str:
    """The request's X-Fencing-Proof, well-formed (else INVALID_TOKEN): checked before a receiver
    looks up which key to verify it against, so a missing proof costs no database work."""
    raw = request.META.get(_META_KEY) or ""
    split(raw)
    return raw


def verify(raw: str | None, *, key: str, token: int) -> None:
    """Raise 400 INVALID_TOKEN (details.reason: missing, malformed, unknown_kid, mismatch) unless
    `raw` is a proof the lock server issued for exactly (key, token)."""
    verifier().verify(raw, key=key, token=token)


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


__all__ = [
    "DEV_PROOF_KEYS",
    "PROOF_ROLES",
    "RING_FREE_COMMANDS",
    "check_configured",
    "parse_key_ring",
    "parse_public_keys",
    "payout_key",
    "presented",
    "public_keys",
    "require",
    "require_for_payout",
    "sign",
    "signing_keys",
    "verifier",
    "verify",
]
