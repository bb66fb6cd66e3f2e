"""Every app and every database: management commands and the test suite."""

import os

from settings.base import *  # noqa: F403
from settings.base import (
    BASE_APPS,
    database,
    logging_config,
    page_middleware,
)

ROLE = "ops"
SERVICE_NAME = "ops"
# The admin app for its LogEntry model: resolve_payout, record_rail_recovery and
# close_rail_recovery leave the same audit rows an admin action does (payments.resolve,
# payments.recovery); sessions and messages because the admin app needs them.
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    *BASE_APPS,
    "lockserver",
    "payments",
    "railproxy",
    "railstub",
    "executor",
    "ops",
]
# Django's stock middleware list, as the admin's (settings/base.py page_middleware) without
# django-csp and django-axes: the ops URLconf is the union of every role's routes (the suite's
# test client reaches the admin's pages and every /v1 route through it); no server runs ROLE=ops.
MIDDLEWARE = page_middleware(csp=False, axes=False)
ROOT_URLCONF = "settings.ops_urls"
DATABASES = {
    "default": database("PAY_DATABASE_URL"),
    "raildb": database("RAIL_DATABASE_URL"),
}
# lockdb only where it is given: the reconciler (k8s CronJob) reads paydb and raildb and gets no
# lock-database credentials; commands that need lockdb (repair_fence) need LOCK_DATABASE_URL.
if os.environ.get("LOCK_DATABASE_URL"):
    DATABASES["lockdb"] = database("LOCK_DATABASE_URL")
APP_DATABASES = {"lockserver": "lockdb", "railstub": "raildb"}
LOGGING = logging_config(SERVICE_NAME)
# A command that cannot reach a database says so in one line (manage.py); the pool's own
# per-attempt connection warnings would bury it.
LOGGING["loggers"]["psycopg.pool"] = {"level": "ERROR"}
