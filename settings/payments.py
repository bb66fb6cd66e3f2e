"""ROLE=payments (payment-resource): C3 §3.4, health, metrics and the API docs; no page middleware
(settings.base.MIDDLEWARE) and no admin: that is ROLE=admin (settings/admin.py)."""

from settings.base import *  # noqa: F403
from settings.base import BASE_APPS, database, logging_config

ROLE = "payments"
SERVICE_NAME = "payment-resource"
INSTALLED_APPS = [*BASE_APPS, "payments", "railproxy"]
ROOT_URLCONF = "payments.urls"
DATABASES = {"default": database("PAY_DATABASE_URL")}
LOGGING = logging_config(SERVICE_NAME)
