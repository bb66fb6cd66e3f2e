"""A private four-service stack for the operator-tool tests (revoke, repair, reconcile)."""

from __future__ import annotations

import pytest

from tests.conftest import start_stack, stop_stack
from tests.executor.conftest import STACK_ENV


@pytest.fixture(scope="session")
def ops_stack():
    stack = start_stack("ops", STACK_ENV)
    yield stack
    stop_stack(stack)
