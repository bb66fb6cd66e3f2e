from settings.base import *  # noqa: F403
from settings.base import BASE_APPS, database, logging_config

ROLE = "lockserver"
SERVICE_NAME = "lock-server"
INSTALLED_APPS = [*BASE_APPS, "lockserver"]
ROOT_URLCONF = "lockserver.urls"
DATABASES = {"default": database("LOCK_DATABASE_URL")}
LOGGING = logging_config(SERVICE_NAME)
