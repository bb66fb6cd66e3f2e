"""DLOCK_PROOF_KEYS: parsed by one function, a bad value fails loudly, the roles that sign or
verify proofs refuse to start without it, and the others don't need it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from django.core.exceptions import ImproperlyConfigured

from devstack import PROJECT
from dlock import proof

GOOD = "a" * 32


def test_the_first_kid_signs_and_every_kid_verifies():
    ring = proof.parse_key_ring(f"new:{GOOD}, old:{'b' * 40}")
    assert [kid for kid, _ in ring] == ["new", "old"]
    signed = proof.sign(key="payout:x", token=7, ring=ring)
    assert signed.startswith("v1.new.")
    assert proof.parse_key_ring("") == () == proof.parse_key_ring("  ")


@pytest.mark.parametrize(
    "raw",
    [
        "nocolon",
        f":{GOOD}",
        "k1:short",
        f"k1:{GOOD},",
        f"k1:{GOOD},k1:{GOOD}",
        f"bad kid:{GOOD}",
        f"{'k' * 33}:{GOOD}",
    ],
)
def test_a_bad_key_ring_is_improperly_configured(raw):
    with pytest.raises(ImproperlyConfigured, match="DLOCK_PROOF_KEYS"):
        proof.parse_key_ring(raw)


def _check(role: str, value: str | None) -> subprocess.CompletedProcess:
    env = {**os.environ, "ROLE": role, "DJANGO_DEBUG": "false"}
    env.pop("DLOCK_PROOF_KEYS", None)
    if value is not None:
        env["DLOCK_PROOF_KEYS"] = value
    return subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=PROJECT, env=env, capture_output=True, text=True
    )


@pytest.mark.parametrize("role", ["lockserver", "payments", "railproxy"])
def test_a_proof_role_refuses_to_start_without_or_with_a_bad_key_ring(role):
    for value in (None, "k1:short"):
        result = _check(role, value)
        assert result.returncode != 0
        assert "DLOCK_PROOF_KEYS" in result.stderr


def test_production_refuses_the_development_key_and_other_roles_need_no_ring():
    refused = _check("payments", proof.DEV_PROOF_KEYS)
    assert refused.returncode != 0 and "development key" in refused.stderr
    assert _check("railstub", None).returncode == 0, _check("railstub", None).stderr


@pytest.mark.parametrize("role", ["lockserver", "payments", "railproxy"])
def test_a_migration_needs_no_key_ring_and_every_other_command_does(role, settings):
    """The migrate Job holds database credentials only: `manage.py migrate` of a proof role
    starts without the ring; serving, `check` and any other command still refuse."""
    settings.DLOCK_PROOF_KEYS = ()
    proof.check_configured(role, "migrate")
    for command in (None, "check", "runserver", "shell", "revoke_lock"):
        with pytest.raises(ImproperlyConfigured, match="DLOCK_PROOF_KEYS"):
            proof.check_configured(role, command)
