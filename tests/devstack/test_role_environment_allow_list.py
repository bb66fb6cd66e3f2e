"""A local role gets the caller's system basics and dlock's own settings from the shell that
starts it, and nothing else: a cloud token or a password exported in that shell never reaches a
role (nor its record under .run/roles/). Before, every role inherited the whole environment."""

from __future__ import annotations

from pathlib import Path

from devstack.roles import RoleProcess
from devstack.secrets_env import caller_environment, role_environment

SHELL = {
    "PATH": "/usr/bin:/bin",
    "HOME": "/home/oncall",
    "LC_ALL": "C.UTF-8",
    "RAIL_READ_TIMEOUT_MS": "1500",  # a dlock setting the caller tunes
    "DB_POOL_MAX": "4",
    "GUNICORN_WORKERS": "2",
    "AWS_SECRET_ACCESS_KEY": "aws-canary",
    "GITHUB_TOKEN": "ghp-canary",
    "PGPASSWORD": "pg-canary",
    "SSH_AUTH_SOCK": "/tmp/ssh-canary",
    "HISTFILE": "/home/oncall/.bash_history",
}
PASSED = {"PATH", "HOME", "LC_ALL", "RAIL_READ_TIMEOUT_MS", "DB_POOL_MAX", "GUNICORN_WORKERS"}


def test_make_ups_roles_take_only_the_allow_listed_part_of_the_shell():
    for role in ("lockserver", "payments", "railproxy", "railstub", "admin"):
        got = role_environment(role, {"DJANGO_SECRET_KEY": "x" * 48}, base=SHELL)
        assert {k for k in got if k in SHELL} == PASSED, role
        assert not any("canary" in v for v in got.values()), role


def test_a_role_process_started_from_a_shell_inherits_only_the_allow_list(monkeypatch, tmp_path):
    for name, value in SHELL.items():
        monkeypatch.setenv(name, value)
    proc = RoleProcess("railstub", 20_000, {"RAIL_DATABASE_URL": "postgres://r"}, tmp_path / "l")
    proc.pod_dir = Path(tmp_path)
    env = proc.environment()
    assert {k for k in env if k in SHELL} == PASSED
    assert env["RAIL_DATABASE_URL"] == "postgres://r" and env["ROLE"] == "railstub"
    assert caller_environment(SHELL).keys() == PASSED
