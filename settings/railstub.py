from settings.base import *  # noqa: F403
from settings.base import BASE_APPS, database, logging_config

ROLE = "railstub"
SERVICE_NAME = "rail-stub"
INSTALLED_APPS = [*BASE_APPS, "railstub"]
ROOT_URLCONF = "railstub.urls"
DATABASES = {"default": database("RAIL_DATABASE_URL")}
LOGGING = logging_config(SERVICE_NAME)
DLOCK_MACHINE_PATHS = frozenset({"/submit"})
