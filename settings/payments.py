from settings.base import *  # noqa: F403
from settings.base import BASE_APPS, MIDDLEWARE, database, logging_config

ROLE = "payments"
SERVICE_NAME = "payment-resource"
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    *BASE_APPS,
    "payments",
    "railproxy",
]
MIDDLEWARE = [
    *MIDDLEWARE[:4],
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    *MIDDLEWARE[4:],
]
ROOT_URLCONF = "payments.urls"
DATABASES = {"default": database("PAY_DATABASE_URL")}
LOGGING = logging_config(SERVICE_NAME)
