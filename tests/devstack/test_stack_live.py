"""`make up` / `make clean` / restarting a role, on a real stack of the test's own (free ports,
a temporary run directory, its own PostgreSQL cluster and etcd)."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import uuid

import psycopg
import pytest
import requests

from devstack.common import DB_URL_ENV, PROJECT, StackError, port_open
from devstack.envfile import read_env
from devstack.postgres import state_root
from devstack.stack import TopologyMismatch, clean, restart_role, up
from dlock import proof
from dlock.client import LockClient
from experiment.stack import from_stack_env

pytestmark = [pytest.mark.live, pytest.mark.slow]


def _etcd_key_count(etcd_url: str) -> int:
    everything = base64.b64encode(b"\0").decode()
    body = {"key": everything, "range_end": everything, "count_only": True}
    reply = requests.post(f"{etcd_url}/v3/kv/range", json=body, timeout=5)
    reply.raise_for_status()
    return int(reply.json().get("count", 0))


def _process_env(pid: int) -> dict[str, str]:
    raw = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


@pytest.mark.etcd
def test_up_on_etcd_then_up_then_a_lockserver_restart_stays_on_etcd(run_dir, stack_ports):
    started = up("etcd", run=run_dir, ports=stack_ports)
    stack_env = (run_dir / "stack.env").read_text()
    assert started["LOCK_BACKEND"] == "etcd"

    # `make up` (no LOCK_BACKEND) keeps the running stack's backend and rewrites nothing
    again = up(run=run_dir)
    assert again["LOCK_BACKEND"] == "etcd"
    assert (run_dir / "stack.env").read_text() == stack_env

    # asking for another backend is refused, naming the running one and how to switch
    with pytest.raises(TopologyMismatch) as refused:
        up("pg", run=run_dir)
    assert "already running with LOCK_BACKEND=etcd" in str(refused.value)
    assert "make down" in str(refused.value)
    cli = subprocess.run(
        [sys.executable, "-m", "devstack", "up", "--backend", "pg"],
        cwd=PROJECT,
        env={
            **{k: v for k, v in os.environ.items() if k not in DB_URL_ENV.values()},
            "DLOCK_RUN_DIR": str(run_dir),
        },
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert cli.returncode == 1
    assert "already running with LOCK_BACKEND=etcd" in cli.stdout
    assert (run_dir / "stack.env").read_text() == stack_env
    assert read_env(run_dir / "stack.env")["LOCK_BACKEND"] == "etcd"

    # the experiment's "restart lockserver" fault, even with a stack.env that lies (what the
    # old `make up` wrote) and a caller whose environment says pg
    (run_dir / "stack.env").write_text(stack_env.replace("LOCK_BACKEND=etcd", "LOCK_BACKEND=pg"))
    handle = from_stack_env(run_dir)
    (run_dir / "stack.env").write_text(stack_env)
    os.environ["LOCK_BACKEND"] = "pg"  # removed again by the run_dir fixture's monkeypatch
    handle.restart_role("lockserver")
    del os.environ["LOCK_BACKEND"]

    pid = int((run_dir / "pids" / "lockserver.pid").read_text())
    assert _process_env(pid)["LOCK_BACKEND"] == "etcd"
    etcd_url = started["ETCD_URL"]
    before = _etcd_key_count(etcd_url)
    client = LockClient(started["LOCK_SERVER_URL"], f"devstack-{uuid.uuid4().hex[:6]}")
    key = f"payout:acct-{uuid.uuid4().hex}"
    with client.session(5_000) as session, session.lock(key, 3_000) as grant:
        assert _etcd_key_count(etcd_url) > before  # the restarted server's grants live in etcd
    # The stack's proof signing keys: generated once (.run/proof_keys), in the lock server only
    # and not in stack.env; the verifiers hold public keys (tests/devstack/test_stack_secrets.py).
    ring_value = (run_dir / "proof_keys").read_text().strip()
    assert "DLOCK_PROOF_KEYS" not in read_env(run_dir / "stack.env")
    lockserver_pid = int((run_dir / "pids" / "lockserver.pid").read_text())
    assert _process_env(lockserver_pid)["DLOCK_PROOF_KEYS"] == ring_value
    for role in ("payments", "railproxy"):
        role_pid = int((run_dir / "pids" / f"{role}.pid").read_text())
        assert "DLOCK_PROOF_KEYS" not in _process_env(role_pid), role
    ring = proof.parse_key_ring(ring_value)
    assert grant.proof == proof.sign(key=key, token=grant.token, ring=ring)
    # the admin role: its own pod on ADMIN_URL, with neither the ring nor the credential hashes
    admin_pid = int((run_dir / "pids" / "admin.pid").read_text())
    admin_env = _process_env(admin_pid)
    assert admin_env["ROLE"] == "admin"
    assert not {"DLOCK_PROOF_KEYS", "DLOCK_CREDENTIALS"} & set(admin_env)
    admin_url = read_env(run_dir / "stack.env")["ADMIN_URL"]
    login = requests.get(f"{admin_url}/admin/login/", timeout=10)
    assert login.status_code == 200 and "csrfmiddlewaretoken" in login.text
    pay = started["PAYMENTS_URL"].split(",")[0]
    assert requests.get(f"{pay}/admin/login/", timeout=10).status_code == 404

    # A restart that is not ready in time still leaves its new pod recorded, so `make down`
    # (and the next restart) stops it: it used to keep the dead pid and leave the pod listening.
    with pytest.raises(StackError):
        restart_role("railstub", run=run_dir, timeout=0.001)
    unready = int((run_dir / "pids" / "railstub.pid").read_text())
    assert _process_env(unready)["ROLE"] == "railstub"  # the new pod, alive and recorded
    again = restart_role("railstub", run=run_dir)  # stops the recorded pod, starts anew
    assert again.process.pid != unready and not os.path.exists(f"/proc/{unready}/status")


def _mark(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE leftover (note text)")
        conn.execute("INSERT INTO leftover VALUES ('from the last stack')")


def _has_leftover(url: str) -> bool:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute("SELECT to_regclass('leftover') IS NOT NULL").fetchone()[0]


def _migrated(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute("SELECT count(*) FROM django_migrations").fetchone()[0]


def test_clean_removes_everything_up_made_and_the_next_up_starts_empty(run_dir, stack_ports):
    env = up(run=run_dir, ports=stack_ports)
    db_urls = [env[var] for var in DB_URL_ENV.values()]
    for url in db_urls:
        _mark(url)
    datadir = state_root(run_dir)
    assert (datadir / "pg" / "PG_VERSION").exists()

    removed = clean(run=run_dir)

    assert not run_dir.exists()
    assert not datadir.exists()  # as root: /tmp/dlock-<hash>/, not under the run directory
    assert datadir in removed or datadir == run_dir
    assert not port_open(int(env["DLOCK_PG_PORT"]))
    assert not any(port_open(port) for port in stack_ports.values())

    again = up(run=run_dir, ports=stack_ports)
    fresh_urls = [again[var] for var in DB_URL_ENV.values()]
    assert [u.rsplit("/", 1)[1] for u in fresh_urls] == [u.rsplit("/", 1)[1] for u in db_urls]
    assert not any(_has_leftover(url) for url in fresh_urls)
    assert all(_migrated(url) > 0 for url in fresh_urls)


def test_clean_removes_a_cluster_kept_in_the_run_directory_as_a_non_root_up_keeps_it():
    """Not root: `up` keeps the cluster in `<run dir>/pg` (state_root). The suite runs as root
    and this checkout's interpreter is not reachable by other users, so the cluster is real
    (started as `postgres`, as root must) but laid out the way a non-root `up` lays it out."""
    import tempfile
    from pathlib import Path

    from devstack.common import free_port
    from devstack.envfile import write_env
    from devstack.postgres import PgCluster

    run = Path(tempfile.mkdtemp(prefix="dlock-nonroot-")) / "run"
    run.mkdir(parents=True)
    run.parent.chmod(0o755)
    run.chmod(0o755)
    datadir = state_root(run, as_root=False) / "pg"
    assert datadir == run / "pg"
    cluster = PgCluster(datadir, free_port(), fast=True)
    cluster.start()
    url = cluster.create_database("paydb")
    _mark(url)
    write_env(
        run / "stack.env",
        {
            "DLOCK_PG_DATADIR": str(datadir),
            "DLOCK_PG_PORT": str(cluster.port),
            "PAY_DATABASE_URL": url,
        },
    )

    removed = clean(run=run)

    assert run in removed
    assert not run.exists() and not datadir.exists()
    assert not port_open(cluster.port)
    run.parent.rmdir()
