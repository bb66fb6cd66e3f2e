"""Fixtures for the payment-resource tests: pytest-django's own `client` is production-like."""
