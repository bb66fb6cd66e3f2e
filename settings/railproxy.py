from settings.base import *  # noqa: F403
from settings.base import BASE_APPS, database, logging_config

ROLE = "railproxy"
SERVICE_NAME = "rail-proxy"
INSTALLED_APPS = [*BASE_APPS, "payments", "railproxy"]
ROOT_URLCONF = "railproxy.urls"
DATABASES = {"default": database("PAY_DATABASE_URL")}
LOGGING = logging_config(SERVICE_NAME)
