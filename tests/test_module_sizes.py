"""The house stays small enough to read, by a ratchet rather than a cap: every runtime and tooling
module has a line budget in tests/module_budgets.txt that it may not grow past, and a budget only
goes down (a module well under its budget has its budget lowered). An entry over 400 lines says
why the module is one piece. Functions stay within 80 lines (tests and migrations aside). A split
follows a seam the code already has, never a number.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.project_modules import PROJECT, package_files

BUDGETS = Path(__file__).resolve().parent / "module_budgets.txt"
REASON_OVER = 400  # an entry above this many lines carries its reason
SLACK = 0.2  # a module this far under its budget (and SLACK_LINES) has it lowered
SLACK_LINES = 25
MAX_FUNCTION_LINES = 80
# grpcio-tools' output (make etcd-stubs), checked against its .proto files, never edited by hand
GENERATED = PROJECT / "lockserver" / "etcd_proto"


def _modules() -> list[Path]:
    found = [PROJECT / "manage.py"]
    found += [
        path
        for path in package_files(with_migrations=False)
        if GENERATED not in path.parents and path.parts[len(PROJECT.parts)] != "examples"
    ]
    return sorted(found)


def _budgets() -> dict[str, tuple[int, str]]:
    """path -> (budget, reason) from tests/module_budgets.txt."""
    budgets: dict[str, tuple[int, str]] = {}
    for number, raw in enumerate(BUDGETS.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        entry, _, reason = line.partition(" -- ")
        lines, path = entry.split()
        assert path not in budgets, f"module_budgets.txt:{number}: {path} listed twice"
        budgets[path] = (int(lines), reason.strip())
    return budgets


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def test_the_walk_sees_every_package():
    seen = {path.relative_to(PROJECT).parts[0] for path in _modules()}
    assert seen >= {"dlock", "lockserver", "payments", "executor", "bench"}
    assert len(_modules()) > 200


def test_every_module_has_a_budget_and_every_budget_a_module():
    budgets = _budgets()
    names = {str(path.relative_to(PROJECT)) for path in _modules()}
    missing = sorted(f"{_lines(PROJECT / name)} {name}" for name in names - set(budgets))
    assert missing == [], f"add these lines to {BUDGETS.name}: {missing}"
    gone = sorted(set(budgets) - names)
    assert gone == [], f"remove these entries from {BUDGETS.name}: {gone}"


def test_no_module_grows_past_its_budget():
    grown = []
    for path, (budget, _) in _budgets().items():
        if (PROJECT / path).exists() and _lines(PROJECT / path) > budget:
            grown.append(f"{path}: {_lines(PROJECT / path)} lines, budget {budget}")
    assert grown == [], (
        "a module grew past its budget: split it at a seam a reader sees, or shrink it "
        f"(budgets only go down): {grown}"
    )


def test_a_module_well_under_its_budget_has_its_budget_lowered():
    slack = []
    for path, (budget, _) in _budgets().items():
        if not (PROJECT / path).exists():
            continue
        lines = _lines(PROJECT / path)
        if budget - lines > max(SLACK_LINES, SLACK * budget):
            slack.append(f"{path}: lower its budget from {budget} to {lines}")
    assert slack == [], f"in {BUDGETS.name}: {slack}"


def test_every_budget_over_400_lines_says_why_the_module_is_one_piece():
    unexplained = [
        path
        for path, (budget, reason) in _budgets().items()
        if budget > REASON_OVER and len(reason.split()) < 4
    ]
    assert unexplained == [], f"give these entries a one-line reason (after ' -- '): {unexplained}"


def test_no_function_over_80_lines():
    long_functions = []
    for path in _modules():
        text = path.read_text()
        name = str(path.relative_to(PROJECT))
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long_functions.append(f"{name}:{node.name} ({length})")
    assert long_functions == []
