"""ROLE=admin: the staff's Django admin and nothing else (ARCHITECTURE decision 22).

Quarantine, reconciler findings, rail recoveries, payouts, accounts and users, on their own
gunicorn, nginx, port and database pool: a human's log-in never shares a process, a thread or a
database slot with a machine's `/v1` call. It signs and verifies no fencing proof and checks no
`/v1` credential, so it needs neither DLOCK_PROOF_KEYS nor DLOCK_CREDENTIALS; `createsuperuser`,
`changepassword` and django-axes' resets run under it (docs/operations.md "The admin").
"""

from datetime import timedelta

from settings.base import *  # noqa: F403
from settings.base import BASE_APPS, database, logging_config, page_middleware
from settings.env import env_int

ROLE = "admin"
SERVICE_NAME = "admin"
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    *BASE_APPS,
    "payments",
    "railproxy",  # its submission records, read-only (railproxy/admin.py)
    "csp",  # Content-Security-Policy (CONTENT_SECURITY_POLICY below)
    "axes",  # log-in throttling and lockout (AXES_* below)
]
# Django's stock middleware list (settings/base.py page_middleware) with django-csp and
# django-axes where their documentation puts them.
MIDDLEWARE = page_middleware(csp=True, axes=True)
# django-axes checks every log-in before the password does (a locked-out client is refused even
# with the right password); then Django's own backend.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
ROOT_URLCONF = "admin.urls"
# Its own pool on paydb (the admin's pages read and write nothing else): DB_POOL_MAX slots of
# its own, never payment-resource's.
DATABASES = {"default": database("PAY_DATABASE_URL")}
LOGGING = logging_config(SERVICE_NAME)

# Content-Security-Policy on every page (docs/security.md "Admin hardening"): nothing but this
# origin's scripts, styles, images and forms.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'none'"],
        "script-src": ["'self'"],
        "style-src": ["'self'"],
        "img-src": ["'self'", "data:"],
        "font-src": ["'self'"],
        "connect-src": ["'self'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
        "base-uri": ["'none'"],
    },
}

# Log-in throttling (docs/security.md "Admin log-ins"). Two locks, each after
# DLOCK_ADMIN_LOGIN_FAILURE_LIMIT failures, for DLOCK_ADMIN_LOCKOUT_MINUTES:
# * a user name from one client address: a stranger guessing the on-call's password from
#   elsewhere locks only themselves, never the on-call's own log-in;
# * a client address, whatever the names: a sprayer trying fresh names is stopped.
# The address is the one the role's nginx saw (dlock.adminpages.client_ip). A log-in that
# succeeds before the limit clears the counts; failures during a lockout do not extend it.
# Unlock sooner: `manage.py axes_reset_username <name>`, `axes_reset_ip <address>`, `axes_reset`.
AXES_FAILURE_LIMIT = env_int("DLOCK_ADMIN_LOGIN_FAILURE_LIMIT", 5, minimum=1, maximum=100)
AXES_COOLOFF_TIME = timedelta(
    minutes=env_int("DLOCK_ADMIN_LOCKOUT_MINUTES", 30, minimum=1, maximum=7 * 24 * 60)
)
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"], "ip_address"]
AXES_RESET_ON_SUCCESS = True
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
AXES_HTTP_RESPONSE_CODE = 429
AXES_LOCKOUT_CALLABLE = "dlock.adminpages.locked_out_page"
AXES_ENABLE_ACCESS_FAILURE_LOG = False
# The client's address as the role's proxy sets it (X-Forwarded-For = $remote_addr, a client's
# own copy replaced; behind its unix socket REMOTE_ADDR is empty).
AXES_CLIENT_IP_CALLABLE = "dlock.adminpages.client_ip"
AXES_VERBOSE = False  # dlock.adminpages writes the audit lines (admin_login_failed, ...)
