"""The house stays small enough to read: no runtime or tooling module over 500 lines and no
function over 80 (tests and migrations aside). A split follows a seam the code already has."""

from __future__ import annotations

import ast
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
PACKAGES = (
    "admin",
    "bench",
    "devstack",
    "dlock",
    "executor",
    "experiment",
    "lockserver",
    "ops",
    "payments",
    "railproxy",
    "railstub",
    "scripts",
    "settings",
)
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80


def _modules() -> list[Path]:
    found = [PROJECT / "manage.py"]
    for package in PACKAGES:
        found += [
            path for path in (PROJECT / package).rglob("*.py") if "migrations" not in path.parts
        ]
    return sorted(found)


def test_the_walk_sees_every_package():
    seen = {path.relative_to(PROJECT).parts[0] for path in _modules()}
    assert seen >= {"dlock", "lockserver", "payments", "executor", "bench"}
    assert len(_modules()) > 200


def test_no_module_over_500_lines_and_no_function_over_80():
    long_modules, long_functions = [], []
    for path in _modules():
        text = path.read_text()
        name = str(path.relative_to(PROJECT))
        if len(text.splitlines()) > MAX_MODULE_LINES:
            long_modules.append(f"{name} ({len(text.splitlines())})")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long_functions.append(f"{name}:{node.name} ({length})")
    assert long_modules == []
    assert long_functions == []
