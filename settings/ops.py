"""Every app and every database: management commands and the test suite."""

import os

from settings.base import *  # noqa: F403
from settings.base import (
    BASE_APPS,
    BASE_DIR,
    DLOCK_ENVIRONMENT,
    database,
    logging_config,
    page_middleware,
)
from settings.env import env_str

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
# Where an operator's command run by manage.py writes its JSON events (docs/operations.md
# "Exit codes and output"): a file, appended, or "-" for stderr (a pod's log: the production
# default). `--log-json` sends one run's events to the terminal. The terminal itself gets only
# the command's human lines (or its --json answer).
_EVENTS_FILE = BASE_DIR / ".run" / "logs" / "ops-events.log"
DLOCK_EVENTS_LOG = env_str(
    "DLOCK_EVENTS_LOG", "-" if DLOCK_ENVIRONMENT == "production" else str(_EVENTS_FILE)
)
