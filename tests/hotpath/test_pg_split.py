"""bench.proc.PgSplit: PostgreSQL's CPU by process kind, read from /proc (the bench's split)."""

from __future__ import annotations

from pathlib import Path

import psycopg

from bench.proc import PgSplit
from tests import pgplugin


def test_the_split_names_each_process_and_charges_a_backend_its_work():
    with psycopg.connect(pgplugin.SERVER_URL, autocommit=True) as conn:
        pid = conn.info.backend_pid
        # The suite's PostgreSQL runs on this host: the backend's parent is the postmaster.
        root = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        split = PgSplit(root, bench_user="nobody-here")
        first = split.sample()
        conn.execute("SELECT count(*) FROM generate_series(1, 3000000)").fetchone()
        last = split.sample()
    assert last[pid][0] == "backend postgres"
    kinds = {kind for kind, _, _ in last.values()}
    assert {"postmaster", "walwriter", "checkpointer", "reaped"} <= kinds
    used = PgSplit.between(first, last)
    assert used["backend postgres"]["user"] + used["backend postgres"]["system"] > 0
    assert set(used["backend postgres"]) == {"user", "system"}
