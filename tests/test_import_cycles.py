"""No import cycle between project modules: every `import` and `from … import` statement counts,
at module level, inside a function or under `if TYPE_CHECKING:` alike, since each is a
dependency a reader has to follow (ARCHITECTURE decision 27). A module that imports a package's
submodule depends on that submodule, not on the package's `__init__`."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.project_modules import PROJECT, module_name, package_files

# A cycle listed here is one a change is removing; none is left.
KNOWN: list[frozenset[str]] = []


def project_modules() -> dict[str, Path]:
    modules = {"manage": PROJECT / "manage.py"}
    modules.update({module_name(path): path for path in package_files()})
    return modules


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules `name` imports (the most specific module each statement names)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            named = [f"{base}.{alias.name}" for alias in node.names]
            targets = [t for t in named if t in modules]  # `from a import b`, b a module
            if len(targets) < len(named):
                targets.append(base)  # names defined in `base` itself
        else:
            continue
        for target in targets:
            while target and target not in modules:  # `import a.b.c` of a name inside a.b
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(frozenset(component))
    return found


def test_the_graph_sees_the_project_and_its_imports():
    graph = import_graph()
    assert len(graph) > 200
    assert "dlock.http" in graph["dlock.client.transport"]
    assert "dlock.client.errors" in graph["dlock.client.grant"]


def test_the_cycle_finder_finds_a_cycle_through_a_function_level_import():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [frozenset({"a", "b", "c"})]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_between_project_modules():
    unexpected = [
        sorted(component)
        for component in cycles(import_graph())
        if not any(component <= known for known in KNOWN)
    ]
    assert unexpected == []
