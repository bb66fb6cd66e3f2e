"""The demo's "Where to look next": legible lines, and every step that closes the books."""

from __future__ import annotations

from pathlib import Path

from experiment.demo import where

ENV = {
    "PAYMENTS_URL": "http://127.0.0.1:8082",
    "LOCK_SERVER_URL": "http://127.0.0.1:8081",
    "RAIL_PROXY_URL": "http://127.0.0.1:8083",
    "RAIL_STUB_URL": "http://127.0.0.1:8084",
}


def test_every_hint_is_its_own_line_and_the_books_close_with_the_printed_commands():
    text = where(ENV, Path("/tmp/demo"))
    lines = text.splitlines()
    assert not [line for line in lines if line.rstrip().endswith("\\")]  # no run-together lines
    commands = [line.strip() for line in lines if "manage.py" in line]
    for step in (
        "rail_statement",
        "reconcile",
        "record_rail_recovery --all-from-reconcile --dry-run",
        "resolve_payout PAYOUT_ID --to POSTED|FAILED",
        "list_rail_recoveries",
        "close_rail_recovery --transfer RAIL_REF --recovered",
        "close_rail_recovery --transfer RAIL_REF --written-off",
    ):
        assert any(step in c for c in commands), step
    assert "http://127.0.0.1:8085/admin/" in text and "/8082/admin" not in text


def test_the_admin_line_follows_the_stack_env():
    text = where({**ENV, "ADMIN_URL": "https://127.0.0.1:9085"}, Path("/tmp/demo"))
    assert "https://127.0.0.1:9085/admin/" in text and "ROLE=admin" in text
    assert "ROLE=payments" not in text
