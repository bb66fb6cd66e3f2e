"""`.run/stack.env` sources in bash as written, under every option: bash's `set -a; . FILE`
gives each variable exactly the value devstack's Python reader gives it. Before the values
were quoted, the `&` of a TLS database URL ended bash's assignment (and ran the rest as a
background command), so every documented `set -a; . .run/stack.env` line broke under TLS=1."""

from __future__ import annotations

import subprocess
from pathlib import Path

from devstack.envfile import read_env, write_env
from devstack.secrets_env import stack_file_env

CA = "/tmp/dlock run/tls/ca.crt"
TLS_URL = "postgres://postgres@127.0.0.1:5433/{db}?sslmode=verify-full&sslrootcert=" + CA


def sourced(path: Path) -> dict[str, str]:
    """The variables bash has after `set -a; . path`, in an environment of PATH only."""
    out = subprocess.run(
        ["/bin/bash", "-c", 'set -a; . "$1"; env -0', "bash", str(path)],
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        check=True,
    )
    assert out.stderr == b"", out.stderr
    pairs = (item.decode().split("=", 1) for item in out.stdout.split(b"\0") if item)
    return dict(pairs)


def tls_stack_env() -> dict[str, str]:
    """What `make up TLS=1` writes, in shape: URLs with `?` and `&`, https peers, a CA path with
    a space, and values with the other characters bash treats specially."""
    return stack_file_env(
        {
            "LOCK_DATABASE_URL": TLS_URL.format(db="dlock_lockdb"),
            "PAY_DATABASE_URL": TLS_URL.format(db="dlock_paydb"),
            "RAIL_DATABASE_URL": TLS_URL.format(db="dlock_raildb"),
            "LOCK_SERVER_URL": "https://127.0.0.1:8081,https://127.0.0.1:8181",
            "PAYMENTS_URL": "https://127.0.0.1:8082",
            "RAIL_PROXY_URL": "https://127.0.0.1:8083",
            "RAIL_STUB_URL": "https://127.0.0.1:8084",
            "ADMIN_URL": "https://127.0.0.1:8085",
            "LOCK_BACKEND": "pg",
            "DLOCK_CA_BUNDLE": CA,
            "DLOCK_EXECUTOR_CREDENTIAL": "a'b\"c$HOME`x`;|<>*",
            "DJANGO_SECRET_KEY": "s3cr3t&k3y?with=signs and space",
        }
    )


def test_a_tls_stack_env_file_sources_in_bash_exactly_as_python_reads_it(tmp_path):
    path = tmp_path / "stack.env"
    written = tls_stack_env()
    write_env(path, written)
    python = read_env(path)
    assert python == written
    bash = sourced(path)
    assert {key: bash.get(key) for key in python} == python
    assert "sslmode=verify-full&sslrootcert=" in bash["PAY_DATABASE_URL"]


def test_a_file_from_before_the_quoting_still_reads(tmp_path):
    path = tmp_path / "stack.env"
    path.write_text("LOCK_BACKEND=pg\nPAYMENTS_URL=http://127.0.0.1:8082\nEMPTY=\n")
    assert read_env(path) == {
        "LOCK_BACKEND": "pg",
        "PAYMENTS_URL": "http://127.0.0.1:8082",
        "EMPTY": "",
    }
