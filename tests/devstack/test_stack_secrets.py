"""`make up`: each secret reaches exactly the roles that use it (issue 24, item 3).

The fencing-proof private keys go to the lock server alone, the public keys to every role and
stack.env (no secret); the credential hashes go to the lock server, the payment resource and the
rail proxy only; the rail stub (a third party's stand-in) gets neither; `.run/stack.env`, which
executors and ops commands source, carries the callers' credentials, URLs and database URLs but
neither the private keys nor the hash list — also when the shell that runs `make up` exported
them."""

from __future__ import annotations

import json
import os

import pytest

from devstack.envfile import new_proof_keys, public_keys_of, read_env
from devstack.secrets_env import SECRET_USERS, role_environment, stack_file_env
from devstack.stack import up
from dlock.auth import credentials_entry

SERVERS_THAT_VERIFY = {"lockserver", "payments", "railproxy"}
RING, HASHES = "DLOCK_PROOF_KEYS", "DLOCK_CREDENTIALS"
PUBLIC = "DLOCK_FENCING_PUBLIC_KEYS"
PLAINTEXTS = ("DLOCK_EXECUTOR_CREDENTIAL", "DLOCK_OPERATOR_CREDENTIAL")
OWN_DATABASE = {
    "lockserver": "LOCK_DATABASE_URL",
    "payments": "PAY_DATABASE_URL",
    "railproxy": "PAY_DATABASE_URL",
    "railstub": "RAIL_DATABASE_URL",
}


def _process_env(pid: int) -> dict[str, str]:
    raw = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def test_role_environment_gives_each_role_only_the_secrets_it_uses():
    env = {
        RING: new_proof_keys(),
        HASHES: "executor:" + "a" * 64,
        "DLOCK_EXECUTOR_CREDENTIAL": "dlk_exec",
        "DLOCK_OPERATOR_CREDENTIAL": "dlk_op",
        "DJANGO_SECRET_KEY": "x" * 48,
        "PAY_DATABASE_URL": "postgres://p",
        "LOCK_DATABASE_URL": "postgres://l",
        "RAIL_DATABASE_URL": "postgres://r",
    }
    # a shell that sourced an old stack.env, or exported a ring by hand
    shell = {"PATH": "/usr/bin", RING: "old:" + "o" * 40, "DLOCK_OPERATOR_CREDENTIAL": "dlk_old"}
    assert role_environment("lockserver", env, base=shell)[RING] == env[RING]
    for role in ("lockserver", "payments", "railproxy"):
        got = role_environment(role, env, base=shell)
        assert got[HASHES] == env[HASHES]
        assert role == "lockserver" or RING not in got, role
        assert not set(PLAINTEXTS) & set(got), role
        assert got["DJANGO_SECRET_KEY"] == env["DJANGO_SECRET_KEY"] and got["PATH"] == "/usr/bin"
    stub = role_environment("railstub", env, base=shell)
    assert not (set(SECRET_USERS) - {"RAIL_DATABASE_URL"}) & set(stub)
    # each server role gets its own database's URL only (issue 38 item 5)
    assert stub["RAIL_DATABASE_URL"] == "postgres://r"
    assert "PAY_DATABASE_URL" not in stub and "LOCK_DATABASE_URL" not in stub
    databases = {"LOCK_DATABASE_URL", "PAY_DATABASE_URL", "RAIL_DATABASE_URL"}
    for role, own in (
        ("lockserver", {"LOCK_DATABASE_URL"}),
        ("payments", {"PAY_DATABASE_URL"}),
        ("railproxy", {"PAY_DATABASE_URL"}),
        ("executor", set()),
    ):
        assert databases & set(role_environment(role, env, base=shell)) == own, role
    assert databases <= set(role_environment("ops", env, base=shell))
    assert role_environment("executor", env, base=shell)["DLOCK_EXECUTOR_CREDENTIAL"] == "dlk_exec"
    assert RING not in role_environment("executor", env, base=shell)
    assert RING not in stack_file_env(env) and HASHES not in stack_file_env(env)
    assert stack_file_env(env)["DLOCK_OPERATOR_CREDENTIAL"] == "dlk_op"


@pytest.mark.live
@pytest.mark.slow
def test_make_up_starts_each_role_with_only_its_secrets_and_stack_env_holds_no_ring(
    run_dir, stack_ports, monkeypatch
):
    exported_ring = new_proof_keys()
    monkeypatch.setenv(RING, exported_ring)  # must reach no role: the stack has its own ring
    monkeypatch.setenv(HASHES, "executor:" + "b" * 64)
    up(run=run_dir, ports=stack_ports)

    ring = (run_dir / "proof_keys").read_text().strip()
    stack_env = read_env(run_dir / "stack.env")
    assert RING not in stack_env and HASHES not in stack_env
    assert ring not in (run_dir / "stack.env").read_text()
    assert stack_env[PUBLIC] == public_keys_of(ring)  # no secret: adopters read it here
    for var in PLAINTEXTS:
        assert stack_env[var].startswith("dlk_")
    for var in ("LOCK_SERVER_URL", "PAYMENTS_URL", "RAIL_PROXY_URL", "RAIL_STUB_URL"):
        assert stack_env[var].startswith("http://127.0.0.1:")
    for var in ("LOCK_DATABASE_URL", "PAY_DATABASE_URL", "RAIL_DATABASE_URL"):
        assert stack_env[var].startswith("postgres")
    hashes = ",".join(
        [
            credentials_entry(stack_env["DLOCK_EXECUTOR_CREDENTIAL"], "executor"),
            credentials_entry(stack_env["DLOCK_OPERATOR_CREDENTIAL"], "operator"),
        ]
    )

    for role in ("lockserver", "payments", "railproxy", "railstub"):
        record = json.loads((run_dir / "roles" / f"{role}.json").read_text())
        live = _process_env(int(record["pid"]))
        assert live == record["env"], role  # the record holds what the process runs with
        assert not set(PLAINTEXTS) & set(live), role
        if role == "lockserver":
            assert live[RING] == ring, role
        else:  # no other role holds a private signing key
            assert RING not in live, role
            assert ring.partition(":")[2] not in json.dumps(record), role
        if role in SERVERS_THAT_VERIFY:
            assert live[HASHES] == hashes, role
            assert role == "lockserver" or live[PUBLIC] == public_keys_of(ring), role
        else:
            assert HASHES not in live, role
        assert exported_ring not in json.dumps(record), role
        databases = {k for k in live if k.endswith("_DATABASE_URL")}
        assert databases == {OWN_DATABASE[role]}, role  # only its own database's URL
        # the record's copy of the stack env is stack.env's, without the ring or the hashes
        assert RING not in record["stack_env"] and HASHES not in record["stack_env"], role
        assert oct(os.stat(run_dir / "roles" / f"{role}.json").st_mode & 0o777) == "0o600"

    # `make up` again: nothing restarts, nothing in stack.env changes
    before = (run_dir / "stack.env").read_text()
    up(run=run_dir)
    assert (run_dir / "stack.env").read_text() == before
