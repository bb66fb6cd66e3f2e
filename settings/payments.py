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
    "csp",  # Content-Security-Policy (settings.base CONTENT_SECURITY_POLICY)
    "axes",  # admin login throttling and lockout (settings.base AXES_*)
]
# The admin's middlewares, before the static files and CommonMiddleware (as Django orders them).
DLOCK_PAGE_MIDDLEWARE = [
    "csp.middleware.CSPMiddleware",  # outermost: every page, error pages included
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    *DLOCK_PAGE_MIDDLEWARE,
    "axes.middleware.AxesMiddleware",  # last, as django-axes asks: answers a locked-out log-in
]
# django-axes checks every log-in before the password does (a locked-out name is refused even
# with the right password); then Django's own backend.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
# The admin's checks look for its middlewares in MIDDLEWARE; they run inside
# dlock.middleware.PagesMiddleware for every admin request (tests/browser logs in through them).
# Likewise django-axes' middleware (W002). W006 asks to lock by client address too: every client
# reaches the pods through the same proxy, so an address lock would lock every operator out at
# once; the user name is the key (settings.base AXES_LOCKOUT_PARAMETERS).
SILENCED_SYSTEM_CHECKS = ["admin.E408", "admin.E409", "admin.E410", "axes.W002", "axes.W006"]
ROOT_URLCONF = "payments.urls"
DATABASES = {"default": database("PAY_DATABASE_URL")}
LOGGING = logging_config(SERVICE_NAME)
