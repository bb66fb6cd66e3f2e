"""Every app and every database: management commands and the test suite."""

import os

from settings.base import *  # noqa: F403
from settings.base import BASE_APPS, DLOCK_PAGE_MIDDLEWARE, database, logging_config

ROLE = "ops"
SERVICE_NAME = "ops"
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
# The admin's middlewares, before the static files and CommonMiddleware (as Django orders them).
DLOCK_PAGE_MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    *DLOCK_PAGE_MIDDLEWARE,
]
# The admin's checks look for its middlewares in MIDDLEWARE; they run inside
# dlock.middleware.PagesMiddleware for every admin request (tests/browser logs in through them).
SILENCED_SYSTEM_CHECKS = ["admin.E408", "admin.E409", "admin.E410"]
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
