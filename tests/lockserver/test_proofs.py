"""Proof-bound fencing tokens on the lock server, on both backends (ARCHITECTURE decisions 15
and 25): L4/L5 answer an Ed25519 `fencingProof`; L5/L6 refuse a token whose X-Fencing-Proof is
missing, malformed, truncated, signed with an unknown or another key, or issued for another key
or token, and leave the grant in place. `GET /v1/fencing-keys` publishes the public keys."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest
import requests
from django.test import override_settings

from devstack.envfile import public_keys_of
from dlock import proof
from dlock.errors import ApiError
from dlock.fence.proofs import PublicKeys, SigningKeys, Verifier, new_signing_key
from tests.lockserver.conftest import assert_error


def _reason(response) -> str:
    body = assert_error(response, 400, "INVALID_TOKEN")
    assert body["details"]["field"] == "X-Fencing-Proof"
    return body["details"]["reason"]


def _held_token(lock_server, key) -> int:
    return lock_server.get(f"/v1/locks/{key}").json()["fencingToken"]


def test_acquire_answers_a_proof_that_verifies_offline_for_its_key_and_token(lock_server, key):
    grant = lock_server.acquire(key, lock_server.session()).json()

    proof.verify(grant["fencingProof"], key=key, token=grant["fencingToken"])
    assert grant["fencingProof"].startswith("v2.t1.")
    with pytest.raises(ApiError):
        proof.verify(grant["fencingProof"], key=key + "x", token=grant["fencingToken"])
    with pytest.raises(ApiError):
        proof.verify(grant["fencingProof"], key=key, token=grant["fencingToken"] + 1)


def test_renew_answers_the_proof_of_the_same_token(lock_server, key):
    session = lock_server.session()
    grant = lock_server.acquire(key, session).json()

    renewed = lock_server.renew(key, session, grant["fencingToken"], fproof=grant["fencingProof"])

    assert renewed.status_code == 200, renewed.text
    assert renewed.json()["fencingProof"] == grant["fencingProof"]


def test_the_advisory_read_shows_the_token_but_never_the_proof(lock_server, key):
    lock_server.acquire(key, lock_server.session())
    assert "fencingProof" not in lock_server.get(f"/v1/locks/{key}").json()


@pytest.mark.parametrize(
    "forged, reason",
    [
        ("", "missing"),
        ("v2.t1.short", "malformed"),
        ("v1.t1." + "A" * 43, "malformed"),  # the retired HMAC version opens nothing
        ("v2.t1." + "A" * 86 + "\u00e9", "malformed"),
        ("v2.t1." + "A" * 200, "malformed"),
        ("v2.nobody." + "A" * 86, "unknown_kid"),
        ("v2.t1." + "A" * 86, "mismatch"),
    ],
)
def test_renew_and_release_with_a_bad_proof_are_invalid_token_and_the_grant_stays(
    lock_server, key, forged, reason
):
    session = lock_server.session()
    token = lock_server.acquire(key, session).json()["fencingToken"]

    assert _reason(lock_server.renew(key, session, token, fproof=forged)) == reason
    assert _reason(lock_server.release(key, session, token, fproof=forged)) == reason

    info = lock_server.get(f"/v1/locks/{key}").json()
    assert info["held"] is True and info["fencingToken"] == token


def test_a_token_read_on_l7_cannot_release_someone_elses_grant(lock_server, key):
    holder, thief = lock_server.session(), lock_server.session()
    lock_server.acquire(key, holder)
    token = _held_token(lock_server, key)
    other = lock_server.acquire(key + ".mine", thief).json()

    # The thief's own, genuine proof is for another key: it opens nothing here.
    response = lock_server.release(key, holder, token, fproof=other["fencingProof"])

    assert _reason(response) == "mismatch"
    assert _held_token(lock_server, key) == token


def test_a_proof_for_another_token_of_the_same_key_is_refused(lock_server, key):
    session = lock_server.session()
    grant = lock_server.acquire(key, session, ttl_ms=1_000).json()
    stale = proof.sign(key=key, token=grant["fencingToken"] - 1)

    response = lock_server.renew(key, session, grant["fencingToken"], fproof=stale)

    assert _reason(response) == "mismatch"


def test_a_truncated_proof_is_refused_and_the_grant_stays(lock_server, key):
    session = lock_server.session()
    grant = lock_server.acquire(key, session).json()

    for cut in (grant["fencingProof"][:-1], grant["fencingProof"][:40]):
        refused = lock_server.release(key, session, grant["fencingToken"], fproof=cut)
        assert _reason(refused) == "malformed"
    assert _held_token(lock_server, key) == grant["fencingToken"]


def test_a_proof_signed_with_another_key_under_the_servers_kid_is_refused(lock_server, key):
    session = lock_server.session()
    token = lock_server.acquire(key, session).json()["fencingToken"]
    impostor = SigningKeys.parse(new_signing_key("t1"))  # same kid, not the server's key

    forged = impostor.sign(key=key, token=token)

    assert _reason(lock_server.release(key, session, token, fproof=forged)) == "mismatch"
    assert _held_token(lock_server, key) == token


def test_what_a_verifier_holds_mints_nothing(lock_server, key):
    """A verifier holds the public keys: used as a signing key, or as an HMAC secret in the
    retired v1 form, they make nothing the lock server (or another verifier) accepts."""
    session = lock_server.session()
    token = lock_server.acquire(key, session).json()["fencingToken"]
    public_value = public_keys_of(lock_server.env["DLOCK_PROOF_KEYS"])
    kid, _, public_b64 = public_value.partition(":")

    as_private = SigningKeys.parse(f"{kid}:{public_b64}").sign(key=key, token=token)
    message = b"dlock-fencing-proof/v1\n" + key.encode() + b"\n" + str(token).encode()
    mac = hmac.new(public_b64.encode(), message, hashlib.sha256).digest()
    as_hmac = f"v1.{kid}." + base64.urlsafe_b64encode(mac).rstrip(b"=").decode()

    assert _reason(lock_server.release(key, session, token, fproof=as_private)) == "mismatch"
    assert _reason(lock_server.release(key, session, token, fproof=as_hmac)) == "malformed"
    other_verifier = Verifier(PublicKeys.parse(public_value))
    with pytest.raises(ApiError):
        other_verifier.verify(as_private, key=key, token=token)
    assert _held_token(lock_server, key) == token


def test_fencing_keys_are_public_cacheable_and_verify_the_grants(lock_server, key):
    grant = lock_server.acquire(key, lock_server.session()).json()

    answer = requests.get(lock_server.url + "/v1/fencing-keys", timeout=10)  # no credential

    assert answer.status_code == 200, answer.text
    assert "max-age=" in answer.headers["Cache-Control"]
    assert "public" in answer.headers["Cache-Control"]
    body = answer.json()
    assert body["signingKid"] == "t1" and body["proofVersion"] == "v2"
    assert [(k["kid"], k["kty"], k["crv"]) for k in body["keys"]] == [("t1", "OKP", "Ed25519")]
    assert all(set(k) == {"kty", "crv", "kid", "x", "use", "alg"} for k in body["keys"])
    private_b64 = lock_server.env["DLOCK_PROOF_KEYS"].partition(":")[2]
    assert private_b64 not in answer.text
    published = PublicKeys.from_document(body)
    assert published.setting_value() == public_keys_of(lock_server.env["DLOCK_PROOF_KEYS"])
    Verifier(published).verify(grant["fencingProof"], key=key, token=grant["fencingToken"])


def test_rotation_signs_with_the_new_key_and_old_proofs_verify_while_the_old_kid_is_in_the_ring(
    lock_server, key
):
    session = lock_server.session(ttl_ms=30_000)  # outlives two restarts
    old = lock_server.acquire(key, session, ttl_ms=30_000).json()
    current = lock_server.env["DLOCK_PROOF_KEYS"]
    newest = new_signing_key("t2")
    rotated = f"{newest},{current}"
    lock_server.restart(DLOCK_PROOF_KEYS=rotated)
    try:
        published = requests.get(lock_server.url + "/v1/fencing-keys", timeout=10).json()
        assert published["signingKid"] == "t2"
        assert [k["kid"] for k in published["keys"]] == ["t2", "t1"]
        renewed = lock_server.renew(key, session, old["fencingToken"], fproof=old["fencingProof"])
        assert renewed.status_code == 200, renewed.text
        new_proof = renewed.json()["fencingProof"]
        assert new_proof.startswith("v2.t2.") and new_proof != old["fencingProof"]
        verifier_keys = proof.parse_public_keys(public_keys_of(rotated))
        with override_settings(
            DLOCK_PROOF_KEYS=proof.parse_key_ring(""), DLOCK_FENCING_PUBLIC_KEYS=verifier_keys
        ):
            proof.verify(new_proof, key=key, token=old["fencingToken"])
            proof.verify(old["fencingProof"], key=key, token=old["fencingToken"])
        fresh = lock_server.acquire(key + ".2", lock_server.session()).json()
        assert fresh["fencingProof"].startswith("v2.t2.")

        # The old kid dropped from the ring: its proofs stop opening anything.
        lock_server.restart(DLOCK_PROOF_KEYS=newest)
        refused = lock_server.release(key, session, old["fencingToken"], fproof=old["fencingProof"])
        assert _reason(refused) == "unknown_kid"
        assert _held_token(lock_server, key) == old["fencingToken"]
        gone = lock_server.release(key, session, old["fencingToken"], fproof=new_proof)
        assert gone.status_code == 204, gone.text
    finally:
        lock_server.restart()
