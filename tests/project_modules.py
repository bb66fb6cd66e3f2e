"""The project's runtime and tooling modules, for the tests that read the source tree (sizes,
import cycles, import paths): one list of packages and one way to name a module."""

from __future__ import annotations

from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
PACKAGES = (
    "admin",
    "bench",
    "devstack",
    "dlock",
    "examples",
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


def module_name(path: Path) -> str:
    """`payments/fenced_sql/claim.py` → `payments.fenced_sql.claim`; a package is its folder."""
    parts = list(path.relative_to(PROJECT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_files(*, with_migrations: bool = True) -> list[Path]:
    """Every .py file of PACKAGES (that exist), sorted."""
    return sorted(
        path
        for package in PACKAGES
        if (PROJECT / package).is_dir()
        for path in (PROJECT / package).rglob("*.py")
        if with_migrations or "migrations" not in path.parts
    )
