"""The executor is HTTP-only; the operator tools read the payout table through payments."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[2]

DATABASE_MODULES = ("django.db", "payments", "railproxy", "railstub", "lockserver", "ops")


def _imports(path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def test_the_executor_app_imports_no_database_app_and_no_django_db():
    offending = {
        str(path.relative_to(PROJECT)): sorted(
            name
            for name in _imports(path)
            if any(name == mod or name.startswith(mod + ".") for mod in DATABASE_MODULES)
        )
        for path in (PROJECT / "executor").rglob("*.py")
    }
    assert {path: names for path, names in offending.items() if names} == {}


def test_the_operator_tools_spell_no_sql_on_the_payout_table():
    raw = re.compile(r"\b(FROM|JOIN|UPDATE)\s+payout\b", re.I)
    hits = [
        str(path.relative_to(PROJECT))
        for path in (PROJECT / "ops").rglob("*.py")
        if raw.search(path.read_text())
    ]
    assert hits == []
