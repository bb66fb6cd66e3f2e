"""The runtime requirements (requirements.txt → requirements.lock → the image) carry only what
the image's code imports: `requests` is a development requirement (devstack, experiment, bench
and the tests use it), since no module the image ships imports it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent


def image_modules() -> list[Path]:
    """Every Python file `.dockerignore` lets into the image."""
    found: list[Path] = []
    for line in (PROJECT / ".dockerignore").read_text().splitlines():
        rule = line.strip()
        if not rule.startswith("!"):
            continue
        path = PROJECT / rule[1:].rstrip("/")
        if path.is_dir():
            found += [p for p in path.rglob("*.py") if "migrations" not in p.parts]
        elif path.suffix == ".py":
            found.append(path)
    return found


def top_level_imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.add(node.module.split(".")[0])
    return names


def pinned(name: str) -> set[str]:
    text = (PROJECT / name).read_text()
    return {
        m.lower() for m in re.findall(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^]]*\])?==", text, re.M)
    }


def test_the_image_code_is_seen():
    names = {p.relative_to(PROJECT).parts[0] for p in image_modules()}
    assert {"dlock", "lockserver", "payments", "executor", "railproxy", "ops"} <= names
    assert "manage.py" in names


def test_no_module_of_the_image_imports_requests_and_the_runtime_does_not_pin_it():
    importing = [
        str(p.relative_to(PROJECT)) for p in image_modules() if "requests" in top_level_imports(p)
    ]
    assert importing == []
    assert "requests" not in pinned("requirements.txt")
    assert "requests" not in pinned("requirements.lock")
    assert "requests" in pinned("requirements-dev.txt")
