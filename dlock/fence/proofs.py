"""Fencing proofs (ARCHITECTURE decision 25): Ed25519 signatures only the lock server can make.

A proof binds a fencing token to the lock key it was granted for. The lock server signs
(domain tag, key, token) with the newest of its private keys; anyone holding the matching public
keys can check the binding offline, and nobody but the lock server can make a new one: a
verifier's key material mints nothing.

Wire form (`X-Fencing-Proof`, and `fencingProof` in the L4/L5 answers): `v2.<kid>.<signature>`,
the signature as unpadded base64url (86 characters for Ed25519's 64 bytes), over
b"dlock-fencing-proof/v2\\n" + key + b"\\n" + decimal token.

Key material, as settings and in `GET /v1/fencing-keys`:
* signing keys (the lock server only): `kid:<base64url 32-byte Ed25519 private key>[,…]`, the
  first signs, every one also verifies;
* public keys (every verifier): `kid:<base64url 32-byte Ed25519 public key>[,…]`, every one
  verifies, or the JWK set the lock server publishes (`{"keys": [{"kty": "OKP", "crv":
  "Ed25519", "kid": …, "x": …}]}`, RFC 8037).

Nothing here reads Django settings: the kit (`dlock.fence`) and the roles build these objects
from whatever configuration they have.
"""

from __future__ import annotations

import base64
import binascii
import re
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import urllib3
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from dlock.errors import ApiError, Code
from dlock.headers import parse_token_value

HEADER = "X-Fencing-Proof"
TOKEN_HEADER = "X-Fencing-Token"  # noqa: S105 - a header name
VERSION = "v2"
ALGORITHM = "Ed25519"
KID_MAX = 32
PROOF_MAX = 128
DOMAIN = b"dlock-fencing-proof/v2\n"
_KID = re.compile(r"[A-Za-z0-9_\-]{1,32}", re.ASCII)
_KEY_B64 = re.compile(r"[A-Za-z0-9_\-]{43}", re.ASCII)  # 32 bytes, unpadded base64url
# 64 signature bytes are 86 unpadded base64url characters.
_PROOF = re.compile(r"v2\.([A-Za-z0-9_\-]{1,32})\.([A-Za-z0-9_\-]{86})", re.ASCII)


class InvalidToken(ApiError):
    """400 INVALID_TOKEN: the presented token or proof opens nothing for this key.

    `reason` is one of missing, malformed, unknown_kid, mismatch (details.reason on the wire).
    """

    def __init__(self, reason: str, message: str, *, field: str = HEADER) -> None:
        super().__init__(Code.INVALID_TOKEN, message, details={"field": field, "reason": reason})
        self.reason = reason


class KeyFormatError(ValueError):
    """A key-set string or document that is not what the formats above describe."""


def message(*, key: str, token: int) -> bytes:
    """What a proof signs: the domain tag, the lock key and the decimal token."""
    return DOMAIN + key.encode() + b"\n" + str(token).encode()


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _entries(raw: str, setting: str, what: str) -> list[tuple[str, bytes]]:
    entries: list[tuple[str, bytes]] = []
    for entry in (part.strip() for part in raw.split(",")):
        kid, sep, encoded = entry.partition(":")
        if not sep or not _KID.fullmatch(kid):
            raise KeyFormatError(
                f"{setting}: each entry must be kid:<{what}> with kid 1…{KID_MAX} of "
                "[A-Za-z0-9_-] (e.g. k20261206:<43 base64url characters>)"
            )
        if not _KEY_B64.fullmatch(encoded):
            raise KeyFormatError(
                f"{setting}: the {what} of kid {kid!r} must be 32 bytes as 43 unpadded "
                "base64url characters"
            )
        if any(kid == known for known, _ in entries):
            raise KeyFormatError(f"{setting}: kid {kid!r} appears twice")
        entries.append((kid, _unb64(encoded)))
    return entries


@dataclass(frozen=True)
class PublicKeys:
    """The keys a verifier accepts: kid → Ed25519 public key. Immutable, safe to share; equal
    (and hashing alike) when they hold the same kids and key bytes."""

    raw: tuple[tuple[str, bytes], ...]
    keys: tuple[tuple[str, Ed25519PublicKey], ...] = field(compare=False, repr=False, default=())

    def __post_init__(self) -> None:
        try:
            built = tuple((kid, Ed25519PublicKey.from_public_bytes(b)) for kid, b in self.raw)
        except ValueError as exc:
            raise KeyFormatError(str(exc)) from exc
        object.__setattr__(self, "keys", built)

    @classmethod
    def parse(cls, raw: str, *, setting: str = "DLOCK_FENCING_PUBLIC_KEYS") -> PublicKeys:
        """`kid:<base64url public key>[,…]` → PublicKeys; empty → no keys."""
        if raw.strip() == "":
            return cls(())
        return cls(tuple(_entries(raw, setting, "public key")))

    @classmethod
    def from_document(cls, document: Mapping[str, Any]) -> PublicKeys:
        """The JWK set `GET /v1/fencing-keys` answers → PublicKeys (unknown members ignored)."""
        keys = document.get("keys") if isinstance(document, Mapping) else None
        if not isinstance(keys, list):
            raise KeyFormatError("a fencing-keys document has a list under 'keys'")
        parts = []
        for jwk in keys:
            if not isinstance(jwk, Mapping) or (jwk.get("kty"), jwk.get("crv")) != (
                "OKP",
                ALGORITHM,
            ):
                raise KeyFormatError("each key must be a JWK with kty OKP and crv Ed25519")
            kid, x = jwk.get("kid"), jwk.get("x")
            if not isinstance(kid, str) or not isinstance(x, str):
                raise KeyFormatError("each key names its kid and x as strings")
            parts.append(f"{kid}:{x}")
        return cls.parse(",".join(parts), setting="fencing-keys document")

    def __bool__(self) -> bool:
        return bool(self.keys)

    def get(self, kid: str) -> Ed25519PublicKey | None:
        for known, public in self.keys:
            if known == kid:
                return public
        return None

    def kids(self) -> tuple[str, ...]:
        return tuple(kid for kid, _ in self.keys)

    def setting_value(self) -> str:
        """The `kid:<public key>[,…]` string a verifier is configured with."""
        return ",".join(f"{kid}:{_b64(raw)}" for kid, raw in self.raw)

    def document(self, *, signing_kid: str | None = None) -> dict[str, Any]:
        """The JWK set published at `GET /v1/fencing-keys` (public keys, no secret)."""
        body: dict[str, Any] = {
            "keys": [
                {
                    "kty": "OKP",
                    "crv": ALGORITHM,
                    "kid": kid,
                    "x": _b64(raw),
                    "use": "sig",
                    "alg": "EdDSA",
                }
                for kid, raw in self.raw
            ],
            "proofVersion": VERSION,
        }
        if signing_kid is not None:
            body["signingKid"] = signing_kid
        return body


def public_bytes(public: Ed25519PublicKey) -> bytes:
    return public.public_bytes(Encoding.Raw, PublicFormat.Raw)


@dataclass(frozen=True)
class SigningKeys:
    """The lock server's private keys: kid → Ed25519 private key; the first one signs."""

    raw: tuple[tuple[str, bytes], ...] = field(repr=False)
    keys: tuple[tuple[str, Ed25519PrivateKey], ...] = field(compare=False, repr=False, default=())

    def __post_init__(self) -> None:
        try:
            built = tuple((kid, Ed25519PrivateKey.from_private_bytes(b)) for kid, b in self.raw)
        except ValueError as exc:
            raise KeyFormatError(str(exc)) from exc
        object.__setattr__(self, "keys", built)

    @classmethod
    def parse(cls, raw: str, *, setting: str = "DLOCK_PROOF_KEYS") -> SigningKeys:
        """`kid:<base64url private key>[,…]` → SigningKeys; empty → no keys."""
        if raw.strip() == "":
            return cls(())
        return cls(tuple(_entries(raw, setting, "private key")))

    def __bool__(self) -> bool:
        return bool(self.keys)

    def kids(self) -> tuple[str, ...]:
        return tuple(kid for kid, _ in self.keys)

    @property
    def signing_kid(self) -> str:
        return self.keys[0][0]

    def public(self) -> PublicKeys:
        return PublicKeys(
            tuple((kid, public_bytes(private.public_key())) for kid, private in self.keys)
        )

    def sign(self, *, key: str, token: int) -> str:
        """The proof for (key, token), made with the first (newest) key."""
        kid, private = self.keys[0]
        return f"{VERSION}.{kid}.{_b64(private.sign(message(key=key, token=token)))}"


def new_signing_key(kid: str) -> str:
    """A fresh `kid:<private key>` entry (what `make up` and the rotation runbook generate)."""
    if not _KID.fullmatch(kid):
        raise KeyFormatError(f"kid must be 1…{KID_MAX} of [A-Za-z0-9_-]")
    return f"{kid}:{_b64(secrets.token_bytes(32))}"


def split(raw: str | None) -> tuple[str, str]:
    """A presented proof's (kid, signature text), or InvalidToken missing/malformed."""
    if raw is None or raw == "":
        raise InvalidToken("missing", f"{HEADER} is required with {TOKEN_HEADER}")
    match = _PROOF.fullmatch(raw) if len(raw) <= PROOF_MAX else None
    if match is None:
        raise InvalidToken("malformed", f"{HEADER} must be v2.<kid>.<base64url Ed25519 signature>")
    return match.group(1), match.group(2)


class Verifier:
    """Checks proofs against a set of public keys; thread-safe, no global state.

    A proof that verified once is remembered (bounded, least recently used first out) so that a
    holder's repeated calls with one grant cost a dictionary lookup instead of a signature check.
    The memory holds only (key, token, proof) triples that verified, so it can never make a bad
    proof pass.

    `refresh` (e.g. `lambda: fetch_public_keys(url)`) is called when a proof names a kid the
    keys lack — the lock server rotated — at most once per `min_refresh_s` of `clock`.
    """

    def __init__(
        self,
        keys: PublicKeys,
        *,
        cache_size: int = 4096,
        refresh: Callable[[], PublicKeys] | None = None,
        min_refresh_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.keys = keys
        self._cache_size = cache_size
        self._verified: OrderedDict[tuple[str, int, str], None] = OrderedDict()
        self._lock = threading.Lock()
        self._refresh = refresh
        self._min_refresh_s = min_refresh_s
        self._clock = clock
        self._refreshed_at: float | None = None

    def _public(self, kid: str) -> Ed25519PublicKey | None:
        public = self.keys.get(kid)
        if public is not None or self._refresh is None:
            return public
        with self._lock:
            now = self._clock()
            due = self._refreshed_at is None or now - self._refreshed_at >= self._min_refresh_s
            if due:
                self._refreshed_at = now
        if due:
            fresh = self._refresh()
            with self._lock:
                if fresh != self.keys:  # a retired kid's proofs must stop passing
                    self._verified.clear()
                self.keys = fresh
        return self.keys.get(kid)

    def remember(self, raw: str, *, key: str, token: int) -> None:
        """Record a proof known good without checking it: the lock server's own signature,
        just made with one of this verifier's keys, so its L5/L6 check is a lookup."""
        with self._lock:
            self._verified[(key, token, raw)] = None
            if len(self._verified) > self._cache_size:
                self._verified.popitem(last=False)

    def verify(self, raw: str | None, *, key: str, token: int) -> None:
        """Return if `raw` is a proof the lock server issued for exactly (key, token); raise
        InvalidToken (reason missing, malformed, unknown_kid, mismatch) otherwise."""
        kid, signature = split(raw)
        assert raw is not None  # split refused None
        entry = (key, token, raw)
        with self._lock:
            if entry in self._verified:
                self._verified.move_to_end(entry)
                return
        public = self._public(kid)
        if public is None:
            raise InvalidToken(
                "unknown_kid", f"{HEADER} was signed with a key this verifier does not hold"
            )
        try:
            public.verify(_unb64(signature), message(key=key, token=token))
        except (InvalidSignature, ValueError, binascii.Error):
            raise InvalidToken(
                "mismatch", f"{HEADER} was not issued for this lock key and token"
            ) from None
        self.remember(raw, key=key, token=token)


def fetch_public_keys(
    lock_server_url: str,
    *,
    timeout: float = 5.0,
    http: urllib3.PoolManager | None = None,
    ca_certs: str | None = None,
) -> PublicKeys:
    """The lock server's current public keys from `GET /v1/fencing-keys` (no credential; the
    first of a comma-separated URL list that answers), over urllib3 (`http`: a pool manager of
    your own, else one made for the call, verifying https against `ca_certs` or the system's
    CAs). Raises urllib3's errors, KeyFormatError, or ValueError for a non-200 answer; call it
    at start-up and as a Verifier's `refresh`."""
    pool = http or urllib3.PoolManager(ca_certs=ca_certs)
    failure: Exception | None = None
    for url in (part.strip().rstrip("/") for part in lock_server_url.split(",")):
        if not url:
            continue
        try:
            answer = pool.request(
                "GET", f"{url}/v1/fencing-keys", timeout=timeout, retries=False, redirect=False
            )
        except urllib3.exceptions.NewConnectionError as exc:  # nothing reached: try the next
            failure = exc
            continue
        if answer.status != 200:
            raise ValueError(f"{url}/v1/fencing-keys answered {answer.status}")
        return PublicKeys.from_document(answer.json())
    raise failure or ValueError("no lock server URL given")


def verified_token(headers: Mapping[str, str], *, key: str, verifier: Verifier) -> int:
    """Headers in, token out: X-Fencing-Token (a decimal int64 > 0) and X-Fencing-Proof must
    bind that token to `key`, the lock key of the row or call the request is about to touch.
    `headers` is any case-insensitive mapping of header names (requests', Django's
    request.headers) or a plain dict with the canonical spellings. Raises InvalidToken."""
    raw_token = headers.get(TOKEN_HEADER)
    try:
        token = parse_token_value(raw_token, field=TOKEN_HEADER)
    except ApiError as exc:
        reason = "missing" if not raw_token else "malformed"
        raise InvalidToken(reason, exc.message, field=TOKEN_HEADER) from None
    verifier.verify(headers.get(HEADER), key=key, token=token)
    return token
