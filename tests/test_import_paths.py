"""One import path per name (ARCHITECTURE decision 27): a runtime or tooling module imports each
name from the module that defines it, and no `_private` name crosses modules. Read from the source
(ast), so the check needs no settings and sees function-level imports too.

A declared public API may gather names from its own parts: `dlock.client`, the fence kit
(`dlock.fence`), `payments.models`, and the admin registrations Django needs (`*.admin`).
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.project_modules import module_name, package_files

PUBLIC_APIS = ("dlock.client", "dlock.fence", "payments.models")
GENERATED = ("lockserver.etcd_proto",)  # grpcio-tools' output imports its siblings as it likes


def _modules() -> dict[str, Path]:
    return {module_name(path): path for path in package_files(with_migrations=False)}


MODULES = _modules()
TREES = {name: ast.parse(path.read_text()) for name, path in MODULES.items()}


def _defined(tree: ast.Module) -> set[str]:
    """Names a module binds itself at top level (not by importing them)."""
    names: set[str] = set()
    for statement in tree.body:
        nodes = ast.walk(statement) if isinstance(statement, ast.If | ast.Try) else [statement]
        for node in nodes:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names.update(
                    leaf.id
                    for target in targets
                    for leaf in ast.walk(target)
                    if isinstance(leaf, ast.Name)
                )
    return names


DEFINED = {name: _defined(tree) for name, tree in TREES.items()}


def _source(importer: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = importer.split(".")
    if MODULES[importer].name != "__init__.py":
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _project_imports():
    """(importer, source module, name) for every `from <project module> import name`."""
    for importer, tree in TREES.items():
        if importer.startswith(GENERATED):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                source = _source(importer, node)
                if source in MODULES:
                    for alias in node.names:
                        if alias.name != "*":
                            yield importer, source, alias.name


def _is_public_api(module: str) -> bool:
    return module.startswith(PUBLIC_APIS) or module.endswith(".admin") or ".admin." in module


def test_every_name_is_imported_from_the_module_that_defines_it():
    through = sorted(
        {
            f"{source}.{name} (in {importer})"
            for importer, source, name in _project_imports()
            if name not in DEFINED[source]
            and f"{source}.{name}" not in MODULES
            and not _is_public_api(source)
        }
    )
    assert through == [], "import these from the module that defines them"


def test_no_private_name_crosses_modules():
    reached = sorted(
        f"{importer}: {source}.{name}"
        for importer, source, name in _project_imports()
        if name.startswith("_") and not name.startswith("__") and source != importer
    )
    assert reached == [], "make what another module needs public"
