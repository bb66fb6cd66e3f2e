from settings.base import *  # noqa: F403
from settings.base import BASE_APPS, DLOCK_PAGE_MIDDLEWARE, database, logging_config

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
ROOT_URLCONF = "payments.urls"
DATABASES = {"default": database("PAY_DATABASE_URL")}
LOGGING = logging_config(SERVICE_NAME)
