"""OpenAPI declarations of C3 §3.3 L1–L8 (request/response shapes, headers, error statuses).

Documentation only: the views parse with their own strict serializers and the dlock header
seams; these serializers are never used to validate. Field names are C3's. Error statuses are
those C3 lists for the path (plus any the implementation answers); `dlock.schema`'s hook gives
each the `ErrorEnvelope` body and adds the statuses every endpoint can answer.
"""

from __future__ import annotations

from typing import Any

from django.core.validators import RegexValidator
from drf_spectacular.utils import extend_schema
from rest_framework import serializers

from dlock.headers import OWNER_ID_MAX
from dlock.schema import (
    KEY_PATTERN,
    OPTIONAL_OWNER_HEADER,
    OWNER_HEADER,
    OWNER_PATTERN,
    PROOF_HEADER,
    TOKEN_HEADER,
    UUID_SCHEMA,
    errors,
    path_param,
    query_param,
)

INT64_MAX = 2**63 - 1
TTL_MIN_MS, TTL_MAX_MS, WAIT_MAX_MS = 1_000, 60_000, 30_000
TAGS = ["locks"]

KEY_PARAM = path_param(
    "key",
    {"type": "string", "minLength": 1, "maxLength": 128, "pattern": KEY_PATTERN},
    "Lock key, e.g. payout:{accountId}.",
)
SESSION_PARAM = path_param("session_id", UUID_SCHEMA, "The sessionId from L1.")
NOT_LEADER = "NOT_LEADER: this replica cannot serve writes; retry after retryAfterMillis."


def _ttl(**kwargs: Any) -> serializers.IntegerField:
    return serializers.IntegerField(min_value=TTL_MIN_MS, max_value=TTL_MAX_MS, **kwargs)


def _token(**kwargs: Any) -> serializers.IntegerField:
    return serializers.IntegerField(min_value=1, max_value=INT64_MAX, **kwargs)


# ------------------------------------------------------------------------------- request bodies


class OpenSession(serializers.Serializer):
    ownerId = serializers.CharField(
        validators=[RegexValidator(OWNER_PATTERN)],
        required=False,
        allow_blank=True,
        max_length=OWNER_ID_MAX,
        help_text="Or X-Owner-Id; must agree if both. Empty counts as absent.",
    )
    ttlMillis = _ttl(required=False, help_text="Default lock.session.ttl.")


class Acquire(serializers.Serializer):
    sessionId = serializers.UUIDField()
    ttlMillis = _ttl(required=False, help_text="Default lock.default.ttl.")
    waitMillis = serializers.IntegerField(
        required=False, min_value=0, max_value=WAIT_MAX_MS, help_text="Default 0 (no waiting)."
    )


class Renew(serializers.Serializer):
    sessionId = serializers.UUIDField()
    ttlMillis = _ttl(required=False)


class Revoke(serializers.Serializer):
    operator = serializers.CharField(min_length=1, max_length=128)
    reason = serializers.CharField(min_length=8, max_length=2_000)
    expectedToken = _token(required=False, help_text="CAS guard: revoke only this grant.")


# ------------------------------------------------------------------------------ response bodies


class Session(serializers.Serializer):
    sessionId = serializers.UUIDField()
    ownerId = serializers.CharField()
    ttlMillis = serializers.IntegerField(help_text="Granted; may be clamped down.")
    expiresAt = serializers.DateTimeField()


class Heartbeat(serializers.Serializer):
    sessionId = serializers.UUIDField()
    expiresAt = serializers.DateTimeField()
    serverTime = serializers.DateTimeField()
    heldLockCount = serializers.IntegerField(min_value=0)


class LockGrant(serializers.Serializer):
    key = serializers.CharField()
    ownerId = serializers.CharField()
    sessionId = serializers.UUIDField()
    fencingToken = _token()
    fencingProof = serializers.CharField(
        help_text="v2.<kid>.<signature>: the lock server's Ed25519 signature over (key, "
        "fencingToken); send it as X-Fencing-Proof beside the token."
    )
    acquiredAt = serializers.DateTimeField()
    expiresAt = serializers.DateTimeField()


class FencingKey(serializers.Serializer):
    kty = serializers.ChoiceField(choices=["OKP"])
    crv = serializers.ChoiceField(choices=["Ed25519"])
    kid = serializers.RegexField(r"^[A-Za-z0-9_-]{1,32}$", help_text="Named in each proof.")
    x = serializers.RegexField(
        r"^[A-Za-z0-9_-]{43}$", help_text="The 32-byte public key, unpadded base64url."
    )
    use = serializers.ChoiceField(choices=["sig"])
    alg = serializers.ChoiceField(choices=["EdDSA"])


class FencingKeys(serializers.Serializer):
    keys = FencingKey(many=True, help_text="Every key a proof may name; each one verifies.")
    proofVersion = serializers.ChoiceField(choices=["v2"])
    signingKid = serializers.CharField(help_text="The kid new proofs are signed with.")


class LockInfo(serializers.Serializer):
    key = serializers.CharField()
    held = serializers.BooleanField()
    ownerId = serializers.CharField(required=False)
    fencingToken = _token(required=False)
    acquiredAt = serializers.DateTimeField(required=False)
    expiresAt = serializers.DateTimeField(required=False)
    waiterCount = serializers.IntegerField(min_value=0)


class LockOutcome(serializers.Serializer):
    revokedToken = _token()
    newTokenFloor = _token()
    revocationId = serializers.UUIDField()


# ------------------------------------------------------------------------------------ operations

open_session = extend_schema(
    operation_id="openSession",
    summary="L1 open a session",
    tags=["sessions"],
    parameters=[OPTIONAL_OWNER_HEADER],
    request=OpenSession,
    responses={201: Session, **errors({400: "VALIDATION_FAILED", 503: NOT_LEADER})},
)

heartbeat = extend_schema(
    operation_id="heartbeatSession",
    summary="L2 heartbeat a session",
    tags=["sessions"],
    parameters=[SESSION_PARAM, OWNER_HEADER],
    request=None,
    responses={
        200: Heartbeat,
        **errors(
            {
                400: "VALIDATION_FAILED (X-Owner-Id missing or not the session's owner)",
                404: "SESSION_UNKNOWN",
                410: "SESSION_EXPIRED: heartbeat lapsed, locks released",
                503: NOT_LEADER,
            }
        ),
    },
)

close_session = extend_schema(
    operation_id="closeSession",
    summary="L3 close a session, releasing every attached lock",
    tags=["sessions"],
    parameters=[SESSION_PARAM, OWNER_HEADER],
    request=None,
    responses={
        204: None,
        **errors(
            {
                400: "VALIDATION_FAILED (X-Owner-Id missing or not the session's owner)",
                404: "SESSION_UNKNOWN",
                410: "SESSION_EXPIRED",
                503: NOT_LEADER,
            }
        ),
    },
)

acquire = extend_schema(
    operation_id="acquireLock",
    summary="L4 acquire a lock (200 is the grant; contention is 409)",
    tags=TAGS,
    parameters=[KEY_PARAM, OWNER_HEADER],
    request=Acquire,
    responses={
        200: LockGrant,
        **errors(
            {
                400: "VALIDATION_FAILED",
                404: "SESSION_UNKNOWN",
                409: "LOCK_CONTENDED (+details.holderOwnerId, details.expiresAt, retryAfterMillis)",
                410: "SESSION_EXPIRED",
                429: "CONTENTION_EXCEEDED (+retryAfterMillis)",
                503: NOT_LEADER,
            }
        ),
    },
)

renew = extend_schema(
    operation_id="renewLock",
    summary="L5 renew a grant (the token is unchanged)",
    tags=TAGS,
    parameters=[KEY_PARAM, TOKEN_HEADER, PROOF_HEADER, OWNER_HEADER],
    request=Renew,
    responses={
        200: LockGrant,
        **errors(
            {
                400: "INVALID_TOKEN (malformed token; missing or foreign X-Fencing-Proof) or "
                "VALIDATION_FAILED",
                404: "SESSION_UNKNOWN",
                409: "LOCK_LOST (+details.storedToken)",
                410: "SESSION_EXPIRED",
                503: NOT_LEADER,
            }
        ),
    },
)

release = extend_schema(
    operation_id="releaseLock",
    summary="L6 release a grant (compare-and-delete on key and token)",
    description="Compare-and-delete on (key, fencing token) and nothing else; sessionId is carried "
    "for attribution and session bookkeeping, never as part of the predicate.",
    tags=TAGS,
    parameters=[
        KEY_PARAM,
        TOKEN_HEADER,
        PROOF_HEADER,
        OWNER_HEADER,
        query_param("sessionId", UUID_SCHEMA, "The grant's session.", required=True),
    ],
    request=None,
    responses={
        204: None,
        **errors(
            {
                400: "INVALID_TOKEN (malformed token; missing or foreign X-Fencing-Proof) or "
                "VALIDATION_FAILED",
                409: "LOCK_LOST (already expired or taken over; benign)",
                503: NOT_LEADER,
            }
        ),
    },
)

inspect = extend_schema(
    operation_id="inspectLock",
    summary="L7 advisory read of a lock (never for correctness)",
    description="Advisory: the lease may expire between this answer and any action; only the "
    "fenced write is authoritative.",
    tags=TAGS,
    parameters=[KEY_PARAM],
    responses={200: LockInfo, **errors({404: "NOT_FOUND: key never seen"})},
)

revoke = extend_schema(
    operation_id="revokeLock",
    summary="L8 operator revoke: delete the grant and advance the token floor",
    tags=TAGS,
    parameters=[KEY_PARAM],
    request=Revoke,
    responses={
        200: LockOutcome,
        **errors(
            {
                400: "VALIDATION_FAILED",
                404: "NOT_FOUND: not held",
                409: "FENCED_OUT: expectedToken is stale",
                503: NOT_LEADER,
            }
        ),
    },
)

fencing_keys = extend_schema(
    operation_id="fencingKeys",
    summary="The lock server's public fencing keys (a JWK set; open, cacheable)",
    description="What a verifier checks X-Fencing-Proof with: Ed25519 public keys by kid "
    "(RFC 8037 JWKs). No secret: no credential needed. Cache-Control says how long a copy may "
    "be used; a proof naming a kid the copy lacks is a reason to read it again.",
    tags=TAGS,
    auth=[],
    responses={200: FencingKeys},
)
