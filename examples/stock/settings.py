"""The stock service's Django settings: nothing of dlock's but the fencing public keys."""

from __future__ import annotations

import os

import dj_database_url

SECRET_KEY = os.environ.get("EXAMPLE_SECRET_KEY", "example-stock-service-not-secret")
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
INSTALLED_APPS: list[str] = []
MIDDLEWARE: list[str] = []
ROOT_URLCONF = "examples.stock.service"
DATABASES = {"default": dj_database_url.parse(os.environ["EXAMPLE_DATABASE_URL"])}
USE_TZ = True
# The lock server's public keys, `kid:<key>[,…]`: from the environment (make up writes them to
# .run/stack.env) or read once from its GET /v1/fencing-keys (story.py does that when unset).
DLOCK_FENCING_PUBLIC_KEYS = os.environ.get("DLOCK_FENCING_PUBLIC_KEYS", "")
# The kit's events (`fenced_out` with its tokens, resource and owner) as one JSON line each on
# stderr, through python-json-logger: what your log pipeline would read.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"json": {"()": "pythonjsonlogger.json.JsonFormatter"}},
    "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "json"}},
    "loggers": {"dlock": {"handlers": ["stderr"], "level": "INFO", "propagate": False}},
}
