"""Every import contract in pyproject.toml bites: a copy of the tree with one violating import
planted per contract fails `lint-imports`, each contract naming the import planted for it."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"

# contract name (its start) → the (importer, imported) planted to break it, and only it
PLANTED = {
    "kernel < apps < ops < tooling": [
        ("payments", "ops"),
        ("devstack", "bench"),
        ("devstack", "experiment"),
        ("experiment", "bench"),
    ],
    "the lock server, the rail stub and the executor share nothing": [("lockserver", "railstub")],
    "the rail proxy reaches no app but payments": [("railproxy", "railstub")],
    "payments and the rail stub never reach the rail proxy": [("railstub", "railproxy")],
    "the lock server never reaches the rail proxy": [("lockserver", "railproxy")],
    "the executor is HTTP-only": [("executor", "psycopg")],
    "nothing but tooling imports the experiment or the dev stack": [("settings", "experiment")],
    "the admin is a page role": [("admin", "executor"), ("admin", "lockserver")],
    "settings import no app": [("settings", "railstub")],
    "the kernel imports no app and no settings module": [("dlock", "settings")],
    "an adopter's example is written against dlock's public APIs only": [("examples", "payments")],
    "nothing imports the examples": [("ops", "examples")],
}


def _copy_of_the_tree(root: Path) -> None:
    config = tomllib.loads((PROJECT / "pyproject.toml").read_text())["tool"]["importlinter"]
    for package in config["root_packages"]:
        shutil.copytree(PROJECT / package, root / package, ignore=shutil.ignore_patterns("*.pyc"))
    shutil.copy(PROJECT / "pyproject.toml", root / "pyproject.toml")


def _lint_imports(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=root,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(root), "COLUMNS": "400"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _broken_sections(report: str) -> dict[str, str]:
    """contract name → its section of the 'Broken contracts' part of the report."""
    broken = report.split("Broken contracts", 1)[-1]
    parts = re.split(r"\n(?=\S[^\n]*\n-{5,}\n)", broken)
    sections = {part.splitlines()[0].strip(): part for part in parts if "\n-----" in part}
    return {name: text for name, text in sections.items() if name}


def test_every_contract_is_planted_once():
    names = [
        c["name"]
        for c in tomllib.loads((PROJECT / "pyproject.toml").read_text())["tool"]["importlinter"][
            "contracts"
        ]
    ]
    assert sorted(any(n.startswith(p) for n in names) for p in PLANTED) == [True] * len(PLANTED)
    assert len(names) == len(PLANTED)


def test_each_contract_fails_on_the_import_planted_for_it(tmp_path):
    _copy_of_the_tree(tmp_path)
    clean = _lint_imports(tmp_path)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    for index, pairs in enumerate(PLANTED.values()):
        for importer, imported in pairs:
            planted = tmp_path.joinpath(*importer.split(".")) / f"planted_{index}_{imported}.py"
            planted.write_text(f"import {imported}  # a violation, planted\n")

    result = _lint_imports(tmp_path)

    assert result.returncode != 0
    sections = _broken_sections(result.stdout)
    assert len(sections) == len(PLANTED), result.stdout
    for index, (contract, pairs) in enumerate(PLANTED.items()):
        (section,) = [text for name, text in sections.items() if name.startswith(contract[:40])]
        for importer, imported in pairs:
            assert f"{importer}.planted_{index}_{imported} -> {imported}" in section, section
