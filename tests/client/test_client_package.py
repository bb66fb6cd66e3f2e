"""The client package's shape: its error map tracks the catalogue, its modules stay small."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import dlock.client
from dlock.client import ERRORS, check_error_map
from dlock.errors import Code

PACKAGE = Path(dlock.client.__file__).parent


def test_every_catalogue_code_has_its_own_client_exception():
    assert set(ERRORS) == {code.value for code in Code}
    assert all(cls.code == code for code, cls in ERRORS.items())
    check_error_map()  # what the import ran


def test_a_code_missing_from_the_map_fails_the_check():
    incomplete = {code: cls for code, cls in ERRORS.items() if code != "FENCED_OUT"}
    with pytest.raises(RuntimeError, match="FENCED_OUT"):
        check_error_map(incomplete)


def test_a_class_filed_under_the_wrong_code_fails_the_check():
    swapped = {**ERRORS, "FENCED_OUT": ERRORS["LOCK_LOST"]}
    with pytest.raises(RuntimeError, match="mismatched=\\['FENCED_OUT'\\]"):
        check_error_map(swapped)


def test_no_module_over_500_lines_and_no_function_over_80():
    for module in PACKAGE.glob("*.py"):
        text = module.read_text()
        assert text.count("\n") <= 500, module
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno - node.lineno + 1 <= 80, f"{module}:{node.name}"


def test_the_public_names_are_importable_from_the_package():
    for name in dlock.client.__all__:
        assert getattr(dlock.client, name) is not None
