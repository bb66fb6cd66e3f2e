"""The dev stack is tooling in `devstack/`; nothing in the kernel or a role uses it."""

from __future__ import annotations

import ast
import importlib
import os
import re
import subprocess
import sys

from devstack.common import PROJECT

TOOLING_AND_APPS = {
    "devstack",
    "experiment",
    "bench",
    "tests",
    "lockserver",
    "payments",
    "railproxy",
    "railstub",
    "executor",
    "ops",
}
SERVER_ROLES = ("lockserver", "payments", "railproxy", "railstub", "executor", "ops")


def _imported_top_levels(path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_the_kernel_imports_no_app_no_dev_stack_and_no_experiment():
    offenders = {
        str(path.relative_to(PROJECT)): sorted(_imported_top_levels(path) & TOOLING_AND_APPS)
        for path in (PROJECT / "dlock").rglob("*.py")
    }
    assert {path: names for path, names in offenders.items() if names} == {}
    assert not (PROJECT / "dlock" / "devstack.py").exists()
    assert not (PROJECT / "dlock" / "demo.py").exists()


def test_no_server_role_installs_the_experiment():
    for role in SERVER_ROLES:
        overlay = importlib.import_module(f"settings.{role}")
        assert "experiment" not in overlay.INSTALLED_APPS, role
    assert "experiment" in importlib.import_module("settings.tooling").INSTALLED_APPS


def test_the_image_leaves_the_tooling_out():
    rules = (PROJECT / ".dockerignore").read_text().splitlines()
    allowed = {line[1:].rstrip("/") for line in rules if line.startswith("!")}
    assert not allowed & {"experiment", "devstack", "bench", "tests"}
    assert "settings/tooling.py" in rules  # it names an app the image does not have


def test_dev_stack_modules_and_functions_stay_small():
    too_long = []
    for path in sorted((PROJECT / "devstack").glob("*.py")):
        text = path.read_text()
        assert len(text.splitlines()) <= 500, path.name
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                if node.end_lineno - node.lineno + 1 > 80:
                    too_long.append(f"{path.name}:{node.name}")
    assert too_long == []


def _run(argv: list[str], **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        argv,
        cwd=PROJECT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_experiment_command_runs_only_under_the_tooling_settings():
    as_role = _run([sys.executable, "manage.py", "fencing_experiment", "--help"], ROLE="ops")
    assert as_role.returncode != 0
    assert "Unknown command: 'fencing_experiment'" in as_role.stderr
    tooling = _run(
        [sys.executable, "-m", "django", "fencing_experiment", "--help"],
        ROLE="ops",
        DJANGO_SETTINGS_MODULE="settings.tooling",
    )
    assert tooling.returncode == 0, tooling.stderr
    assert "--private-stack" in tooling.stdout


def _make_dry_run(*args: str) -> str:
    result = _run(["make", "-n", *args])
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_make_up_passes_only_what_the_user_chose():
    plain = _make_dry_run("up")
    assert "-m devstack up" in plain
    assert "--backend" not in plain  # the running stack's backend, else pg: decided by devstack
    chosen = _make_dry_run("up", "LOCK_BACKEND=etcd", "ETCD_MEMBERS=3", "REPLICAS=2")
    assert "--backend etcd" in chosen
    assert "--etcd-members 3" in chosen and "--replicas 2" in chosen


def test_make_experiment_keeps_its_command_line_and_runs_on_the_running_backend():
    dry = _make_dry_run("experiment", "EXPERIMENT_ARGS=--ci --seed 31")
    assert "--backend" not in dry
    assert "DJANGO_SETTINGS_MODULE=settings.tooling" in dry
    assert "fencing_experiment --ci --seed 31" in dry
    assert "-m devstack.demo" in _make_dry_run("demo")
    assert "-m devstack clean" in _make_dry_run("clean")


def _make_targets() -> set[str]:
    """Every target the Makefile declares: its .PHONY list and every `name:` rule."""
    text = (PROJECT / "Makefile").read_text()
    phony = set(re.search(r"^\.PHONY:(.*)$", text, re.M).group(1).split())
    rules = set(re.findall(r"^([a-z][a-z0-9-]*):(?!=)", text, re.M))
    return phony | rules


def test_make_help_names_every_target():
    targets = _make_targets()
    assert {"help", "demo", "test", "lint", "clean"} <= targets
    help_text = _run(["make", "--no-print-directory", "help"]).stdout
    missing = sorted(
        target
        for target in targets
        if not re.search(rf"(?<![\w-]){re.escape(target)}(?![\w-])", help_text)
    )
    assert missing == []
