"""Fixtures for the payment-resource tests."""

from __future__ import annotations

import pytest
from django.db import connections
from django.test import Client


class ProductionLikeClient(Client):
    """The DRF handler marks every open atomic block for rollback on an error answer; in a
    plain `django_db` test that includes the test's own wrapping transaction, which production
    never has. The service's own atomic block has already rolled back (or committed) by then,
    so clearing the mark afterwards restores production semantics for the rows we assert on."""

    def request(self, **request):
        try:
            return super().request(**request)
        finally:
            for conn in connections.all(initialized_only=True):
                if conn.in_atomic_block and conn.needs_rollback:
                    conn.needs_rollback = False


@pytest.fixture
def client() -> Client:
    return ProductionLikeClient()
