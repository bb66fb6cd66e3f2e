"""Proof-bound fencing tokens on the lock server, on both backends (ARCHITECTURE decision 15):
L4/L5 answer `fencingProof`; L5/L6 refuse a token whose X-Fencing-Proof is missing, malformed,
signed with an unknown key or issued for another key or token, and leave the grant in place."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest
from django.test import override_settings

from dlock import proof
from dlock.errors import ApiError
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
    assert grant["fencingProof"].startswith("v1.t1.")
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
        ("v1.t1.short", "malformed"),
        ("v2.t1." + "A" * 43, "malformed"),
        ("v1.t1." + "A" * 43 + "\u00e9", "malformed"),
        ("v1.t1." + "A" * 200, "malformed"),
        ("v1.nobody." + "A" * 43, "unknown_kid"),
        ("v1.t1." + "A" * 43, "mismatch"),
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


def test_a_proof_made_with_the_right_shape_but_a_guessed_secret_is_refused(lock_server, key):
    session = lock_server.session()
    token = lock_server.acquire(key, session).json()["fencingToken"]
    message = b"dlock-fencing-proof/v1\n" + key.encode() + b"\n" + str(token).encode()
    mac = hmac.new(b"guess" * 8, message, hashlib.sha256).digest()
    guessed = "v1.t1." + base64.urlsafe_b64encode(mac).rstrip(b"=").decode()

    assert _reason(lock_server.release(key, session, token, fproof=guessed)) == "mismatch"
    assert _held_token(lock_server, key) == token


def test_rotation_signs_with_the_new_key_and_old_proofs_verify_while_the_old_kid_is_in_the_ring(
    lock_server, key
):
    session = lock_server.session(ttl_ms=30_000)  # outlives two restarts
    old = lock_server.acquire(key, session, ttl_ms=30_000).json()
    current = lock_server.env["DLOCK_PROOF_KEYS"]
    rotated = f"t2:{'n' * 40},{current}"
    lock_server.restart(DLOCK_PROOF_KEYS=rotated)
    try:
        renewed = lock_server.renew(key, session, old["fencingToken"], fproof=old["fencingProof"])
        assert renewed.status_code == 200, renewed.text
        new_proof = renewed.json()["fencingProof"]
        assert new_proof.startswith("v1.t2.") and new_proof != old["fencingProof"]
        with override_settings(DLOCK_PROOF_KEYS=proof.parse_key_ring(rotated)):
            proof.verify(new_proof, key=key, token=old["fencingToken"])
        fresh = lock_server.acquire(key + ".2", lock_server.session()).json()
        assert fresh["fencingProof"].startswith("v1.t2.")

        # The old kid dropped from the ring: its proofs stop opening anything.
        lock_server.restart(DLOCK_PROOF_KEYS=f"t2:{'n' * 40}")
        refused = lock_server.release(key, session, old["fencingToken"], fproof=old["fencingProof"])
        assert _reason(refused) == "unknown_kid"
        assert _held_token(lock_server, key) == old["fencingToken"]
        gone = lock_server.release(key, session, old["fencingToken"], fproof=new_proof)
        assert gone.status_code == 204, gone.text
    finally:
        lock_server.restart()
