"""A pod's nginx listens only once its gunicorn has made its socket: a caller who comes while
the role starts (or restarts) is refused at connect -- nothing sent, nothing logged -- instead
of being answered 503 with one `crit` line per request in nginx's log for the missing socket
(nginx logs ENOENT on a unix socket at crit, the level its error log keeps)."""

from __future__ import annotations

import os
import socket
import uuid

import pytest

from devstack.common import free_port
from devstack.roles import RoleProcess
from tests.conftest import migrated_db

pytestmark = [pytest.mark.live]

PROBE = b"GET /health/live HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"


def ask(port: int) -> bytes | None:
    """The answer's status line, or None when the connection was refused."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(PROBE)
            return sock.recv(64).split(b"\r\n", 1)[0]
    except ConnectionRefusedError:
        return None


def test_callers_during_a_roles_start_write_no_line_in_its_proxys_log(tmp_path):
    raildb = migrated_db(f"podstart_{uuid.uuid4().hex[:8]}", "railstub", "RAIL_DATABASE_URL")
    env = {
        "RAIL_DATABASE_URL": raildb,
        "DJANGO_SECRET_KEY": os.environ["DJANGO_SECRET_KEY"],
        "DJANGO_DEBUG": "false",
    }
    proc = RoleProcess("railstub", free_port(), env, tmp_path / "railstub.log").start(wait=False)
    try:
        answers = []
        while not answers or answers[-1] != b"HTTP/1.1 200 OK":
            answers.append(ask(proc.port))
            assert proc.process.poll() is None, proc.logfile.read_text()[-2000:]
        text = proc.proxy_log.read_text() if proc.proxy_log.exists() else ""
        assert "connect() to unix" not in text, text[-2000:]
    finally:
        proc.stop()
