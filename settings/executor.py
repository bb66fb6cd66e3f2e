from settings.base import *  # noqa: F403
from settings.base import BASE_APPS, logging_config

ROLE = "executor"
SERVICE_NAME = "executor"
INSTALLED_APPS = [*BASE_APPS, "executor"]
ROOT_URLCONF = "dlock.urls"
DATABASES: dict = {}  # the worker speaks HTTP only
LOGGING = logging_config(SERVICE_NAME)
