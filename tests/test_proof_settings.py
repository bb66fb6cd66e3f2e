"""DLOCK_PROOF_KEYS (the lock server's private keys) and DLOCK_FENCING_PUBLIC_KEYS (a
verifier's): parsed by one function each, a bad value fails loudly, the lock server refuses to
start without private keys, a verifier without public keys or with private ones, and the other
roles need neither."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from django.core.exceptions import ImproperlyConfigured

from devstack.common import PROJECT
from devstack.envfile import new_proof_keys, public_keys_of
from dlock import proof
from dlock.fence.proofs import InvalidToken, Verifier, new_signing_key

NEW, OLD = new_signing_key("new"), new_signing_key("old")


def test_the_first_kid_signs_and_every_kid_verifies():
    ring = proof.parse_key_ring(f"{NEW}, {OLD}")
    assert ring.kids() == ("new", "old")
    signed = proof.sign(key="payout:x", token=7, ring=ring)
    assert signed.startswith("v2.new.")
    older = proof.sign(key="payout:x", token=7, ring=proof.parse_key_ring(OLD))
    verifier = Verifier(proof.parse_public_keys(public_keys_of(f"{NEW},{OLD}")))
    verifier.verify(signed, key="payout:x", token=7)
    verifier.verify(older, key="payout:x", token=7)
    assert not proof.parse_key_ring("") and not proof.parse_key_ring("  ")


def test_a_verifier_without_the_signing_kid_refuses_its_proofs():
    signed = proof.sign(key="payout:x", token=7, ring=proof.parse_key_ring(NEW))
    with pytest.raises(InvalidToken) as refused:
        Verifier(proof.parse_public_keys(public_keys_of(OLD))).verify(
            signed, key="payout:x", token=7
        )
    assert refused.value.reason == "unknown_kid"


@pytest.mark.parametrize(
    "raw",
    [
        "nocolon",
        f":{NEW.partition(':')[2]}",
        "k1:short",
        f"{NEW},",
        f"{NEW},{NEW}",
        f"bad kid:{NEW.partition(':')[2]}",
        f"{'k' * 33}:{NEW.partition(':')[2]}",
        "k1:" + "a" * 32,  # an HMAC-era secret is no Ed25519 key
    ],
    # fixed ids: the keys are random per process, and xdist's workers must collect one list
    ids=[
        "no-colon",
        "no-kid",
        "short",
        "trailing-comma",
        "kid-twice",
        "bad-kid",
        "long-kid",
        "hmac",
    ],
)
def test_a_bad_key_set_is_improperly_configured(raw):
    with pytest.raises(ImproperlyConfigured, match="DLOCK_PROOF_KEYS"):
        proof.parse_key_ring(raw)
    with pytest.raises(ImproperlyConfigured, match="DLOCK_FENCING_PUBLIC_KEYS"):
        proof.parse_public_keys(raw)


def _check(
    role: str, private: str | None, public: str | None = None, *, production: bool = False
) -> subprocess.CompletedProcess:
    env = {**os.environ, "ROLE": role, "DJANGO_DEBUG": "false"}
    if production:  # its database URLs verified, as production requires
        env["DLOCK_ENVIRONMENT"] = "production"
        for name in ("LOCK_DATABASE_URL", "PAY_DATABASE_URL", "RAIL_DATABASE_URL"):
            if env.get(name):
                joiner = "&" if "?" in env[name] else "?"
                env[name] += f"{joiner}sslmode=verify-full&sslrootcert=/nonexistent/ca.pem"
    env.pop("DLOCK_PROOF_KEYS", None)
    env.pop("DLOCK_FENCING_PUBLIC_KEYS", None)
    if private is not None:
        env["DLOCK_PROOF_KEYS"] = private
    if public is not None:
        env["DLOCK_FENCING_PUBLIC_KEYS"] = public
    return subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=PROJECT, env=env, capture_output=True, text=True
    )


def test_the_lock_server_refuses_to_start_without_or_with_bad_private_keys():
    for value in (None, "k1:short"):
        result = _check("lockserver", value)
        assert result.returncode != 0
        assert "DLOCK_PROOF_KEYS" in result.stderr
    started = _check("lockserver", new_proof_keys())
    assert started.returncode == 0, started.stderr


@pytest.mark.parametrize("role", ["payments", "railproxy"])
def test_a_verifier_starts_with_public_keys_only_and_in_production_refuses_private_ones(role):
    private = new_proof_keys()
    public = public_keys_of(private)

    assert _check(role, None, public).returncode == 0, _check(role, None, public).stderr
    started = _check(role, None, public, production=True)
    assert started.returncode == 0, started.stderr
    missing = _check(role, None, None)
    assert missing.returncode != 0 and "DLOCK_FENCING_PUBLIC_KEYS" in missing.stderr
    holding = _check(role, private, public, production=True)
    assert holding.returncode != 0 and "DLOCK_PROOF_KEYS" in holding.stderr
    bad = _check(role, None, "k1:short")
    assert bad.returncode != 0 and "DLOCK_FENCING_PUBLIC_KEYS" in bad.stderr


@pytest.mark.parametrize("role", ["payments", "railproxy"])
def test_a_verifying_role_never_signs_whatever_its_environment_holds(role, settings):
    settings.ROLE = role
    with pytest.raises(ImproperlyConfigured, match="never signs"):
        proof.sign(key="payout:x", token=7)


def test_production_refuses_the_development_key_and_other_roles_need_no_keys():
    refused = _check("payments", None, public_keys_of(proof.DEV_PROOF_KEYS))
    assert refused.returncode != 0 and "development key" in refused.stderr
    refused = _check("lockserver", proof.DEV_PROOF_KEYS)
    assert refused.returncode != 0 and "development key" in refused.stderr
    assert _check("railstub", None).returncode == 0, _check("railstub", None).stderr


@pytest.mark.parametrize("role", ["lockserver", "payments", "railproxy"])
def test_a_migration_needs_no_keys_and_every_other_command_does(role, settings):
    """The migrate Job holds database credentials only: `manage.py migrate` of a proof role
    starts without keys; serving, `check` and any other command still refuse."""
    settings.DLOCK_PROOF_KEYS = proof.parse_key_ring("")
    settings.DLOCK_FENCING_PUBLIC_KEYS = proof.parse_public_keys("")
    proof.check_configured(role, "migrate")
    for command in (None, "check", "runserver", "shell", "revoke_lock"):
        with pytest.raises(ImproperlyConfigured, match="DLOCK_"):
            proof.check_configured(role, command)
    settings.DLOCK_FENCING_PUBLIC_KEYS = proof.parse_public_keys(public_keys_of(NEW))
    if role != "lockserver":
        proof.check_configured(role, "check")


def test_the_fencing_keys_command_makes_a_key_and_prints_only_its_public_half():
    from io import StringIO

    from django.core.management import call_command

    made = StringIO()
    call_command("fencing_keys", "--new", "k9", stdout=made)
    private = made.getvalue().strip()
    shown = StringIO()
    call_command("fencing_keys", "--public", private, stdout=shown)

    assert proof.parse_key_ring(private).kids() == ("k9",)
    assert shown.getvalue().strip() == public_keys_of(private)
    assert private.partition(":")[2] not in shown.getvalue()
