from settings.base import *  # noqa: F403
from settings.base import BASE_APPS, database, logging_config

ROLE = "railstub"
SERVICE_NAME = "rail-stub"
INSTALLED_APPS = [*BASE_APPS, "railstub"]
ROOT_URLCONF = "railstub.urls"
DATABASES = {"default": database("RAIL_DATABASE_URL")}
# The stub stands in for a third-party rail: its books are not dlock's, so its commits do not
# wait for their WAL flush (CHANGELOG row 58). Only a crash of PostgreSQL itself can lose a
# booking: a fast shutdown (the fencing experiment's restart) flushes the WAL first, and where
# raildb shares the cluster with paydb (devstack, bench, experiments) the rail proxy's durable
# commit of the answer flushes the WAL up to and past the booking anyway.
DATABASES["default"]["OPTIONS"]["options"] += " -c synchronous_commit=off"
LOGGING = logging_config(SERVICE_NAME)
