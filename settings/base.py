"""Settings every role shares; overlays (settings/<role>.py) choose apps, URLs, databases."""

from __future__ import annotations

import os
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from dlock.proof import DEV_KID, parse_key_ring, parse_public_keys
from dlock.roles import SERVICE_NAMES
from settings.env import env_bool, env_credentials, env_database, env_int, env_str

BASE_DIR = Path(__file__).resolve().parent.parent

DEBUG = env_bool("DJANGO_DEBUG", False)
# The container image sets production; there DEBUG can never be switched on (start-up refuses).
DLOCK_ENVIRONMENT = env_str("DLOCK_ENVIRONMENT", "development")
if DLOCK_ENVIRONMENT not in ("development", "production"):
    raise ImproperlyConfigured("DLOCK_ENVIRONMENT must be development or production")
if DEBUG and DLOCK_ENVIRONMENT == "production":
    raise ImproperlyConfigured("DJANGO_DEBUG=true is refused when DLOCK_ENVIRONMENT=production")
if DEBUG:
    SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "dlock-development-only-not-secret")
else:
    SECRET_KEY = env_str("DJANGO_SECRET_KEY", "")
    if len(SECRET_KEY) < 32 or SECRET_KEY.startswith("dlock-development"):
        raise ImproperlyConfigured(
            "DJANGO_SECRET_KEY must be set to a random value of at least 32 characters "
            "(or set DJANGO_DEBUG=true for development)"
        )

# Fencing proofs (ARCHITECTURE decision 25, docs/security.md): Ed25519. The lock server signs
# with DLOCK_PROOF_KEYS (`kid:<private key>[,…]`, the first signs); payments and railproxy verify
# with DLOCK_FENCING_PUBLIC_KEYS (`kid:<public key>[,…]`) and refuse private keys (dlock.apps).
# Neither set: the fixed development key, with DJANGO_DEBUG=true only.
DLOCK_PROOF_KEYS = parse_key_ring(env_str("DLOCK_PROOF_KEYS", ""))
DLOCK_FENCING_PUBLIC_KEYS = parse_public_keys(env_str("DLOCK_FENCING_PUBLIC_KEYS", ""))
if not DEBUG and (
    DEV_KID in DLOCK_PROOF_KEYS.kids() or DEV_KID in DLOCK_FENCING_PUBLIC_KEYS.kids()
):
    raise ImproperlyConfigured("the fencing keys hold the development key; generate real ones")

ALLOWED_HOSTS = [
    h.strip() for h in env_str("DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost").split(",")
]
if "*" in ALLOWED_HOSTS and DLOCK_ENVIRONMENT == "production":
    # Every Host would pass: the Host checks (docs/security.md API8) would do nothing.
    raise ImproperlyConfigured(
        "DJANGO_ALLOWED_HOSTS='*' is refused in production: list the names callers use "
        "(the Service names; k8s/config.yaml)"
    )
if "*" in ALLOWED_HOSTS and not DEBUG:
    ALLOWED_HOSTS = ["*"]  # explicit choice outside production

ROLE = "unset"  # each overlay sets it
SERVICE_NAME = "dlock"

BASE_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "dlock",
]

# django-prometheus' two middlewares first and last, as its documentation places them, so every
# request counts (extended through its Metrics hook, dlock/prometheus.py: a request updates the
# four request series dlock reads, not twelve); between them dlock's two layers
# (dlock/middleware.py: trace id, method guard, SecurityMiddleware, request guards with the
# ALLOWED_HOSTS check, Content-Length and security headers; credentials and the envelope) and
# the static files of the browsable API and the docs (whitenoise: a dictionary lookup for any
# other path). No page middleware: sessions, CSRF, auth, messages, CSP and log-in throttling
# belong to the admin role alone (settings/admin.py, ARCHITECTURE decision 22), so no human's
# page shares a process with a machine's call.
MIDDLEWARE = [
    "dlock.prometheus.BeforeMiddleware",
    "dlock.middleware.EdgeMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "dlock.middleware.ApiMiddleware",
    "dlock.prometheus.AfterMiddleware",
]


def page_middleware(*, csp: bool, axes: bool) -> list[str]:
    """The middleware list of a role that serves pages (settings/admin.py, settings/ops.py).

    Django's stock list in its order, inside django-prometheus' pair and dlock's two layers
    (trace id, method guard, request guards and security headers outside; the envelope for what
    is not a page inside). SecurityMiddleware is the stock one here: dlock's EdgeMiddleware then
    leaves it out of itself. With `csp`, django-csp right after it; with `axes`, django-axes last
    of the page middlewares, as its documentation asks.
    """
    return [
        "dlock.prometheus.BeforeMiddleware",
        "dlock.middleware.EdgeMiddleware",
        "django.middleware.security.SecurityMiddleware",
        *(["csp.middleware.CSPMiddleware"] if csp else []),
        "whitenoise.middleware.WhiteNoiseMiddleware",
        "django.contrib.sessions.middleware.SessionMiddleware",
        "django.middleware.common.CommonMiddleware",
        "django.middleware.csrf.CsrfViewMiddleware",
        "django.contrib.auth.middleware.AuthenticationMiddleware",
        "django.contrib.messages.middleware.MessageMiddleware",
        "django.middleware.clickjacking.XFrameOptionsMiddleware",
        *(["axes.middleware.AxesMiddleware"] if axes else []),
        "dlock.middleware.ApiMiddleware",
        "dlock.prometheus.AfterMiddleware",
    ]


TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

WSGI_APPLICATION = "settings.wsgi.application"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"
LANGUAGE_CODE = "en-us"
# The admin shows every time to the second with its zone (settings/formats/en/formats.py).
FORMAT_MODULE_PATH = ["settings.formats"]
USE_I18N = False
STATIC_URL = "/static/"
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = False
WHITENOISE_MAX_AGE = 86400
APPEND_SLASH = False

# Second listener for monitoring (settings/gunicorn.py): only /metrics and /health/* answer there.
METRICS_PORT = env_int("METRICS_PORT", 0, minimum=0)
# Request limits: the JSON parser enforces the same byte bound for DRF views.
DATA_UPLOAD_MAX_MEMORY_SIZE = env_int("DLOCK_MAX_BODY_BYTES", 64 * 1024, minimum=1024)
DLOCK_MAX_JSON_DEPTH = 32
DATA_UPLOAD_MAX_NUMBER_FIELDS = 200

# Security headers. TLS terminates at the role's proxy (deploy/nginx/, the k8s sidecar), the
# only client gunicorn has; it overwrites X-Forwarded-Proto on every request, so Django may read
# the scheme from it (an https admin form's Origin then matches: CSRF).
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_CONTENT_TYPE_NOSNIFF = True
# same-origin, not no-referrer: with no-referrer Chromium sends `Origin: null` on form POSTs and
# Django's CSRF origin check refuses every admin login. Nothing leaves for another origin.
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = True
# The admin role's staff login: session + CSRF cookies, Secure behind TLS so they never travel
# in clear text: by default whenever the stack runs TLS (`make up TLS=1` sets DLOCK_TLS=1; k8s
# sets DLOCK_SECURE_COOKIES=true). The proxy marks them Secure under TLS as well.
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = env_bool(
    "DLOCK_SECURE_COOKIES", env_bool("DLOCK_TLS", False)
)
SESSION_COOKIE_SAMESITE = CSRF_COOKIE_SAMESITE = "Strict"
SESSION_COOKIE_AGE = 8 * 3600
# Staff passwords (the admin moves money): Django's four validators, at least 12 characters.
# The admin's password forms, `changepassword` and an interactive `createsuperuser` refuse a
# password they reject; `createsuperuser --noinput` sets no password at all (docs/operations.md).
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {
        "NAME": "django.contrib.auth.password_validation.MinimumLengthValidator",
        "OPTIONS": {"min_length": 12},
    },
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
CSRF_TRUSTED_ORIGINS = [
    o.strip() for o in env_str("DJANGO_CSRF_TRUSTED_ORIGINS", "").split(",") if o.strip()
]

REST_FRAMEWORK = {
    # JSON first (every caller that does not ask for HTML gets JSON); the browsable API only
    # answers GET/HEAD from a browser, and errors are always the JSON envelope (dlock.handlers).
    "DEFAULT_RENDERER_CLASSES": [
        "dlock.rendering.JSONRenderer",
        "dlock.rendering.BrowsableAPIRenderer",
    ],
    "DEFAULT_PARSER_CLASSES": ["dlock.parsers.StrictJSONParser"],
    "DEFAULT_CONTENT_NEGOTIATION_CLASS": "dlock.rendering.LenientNegotiation",
    "DEFAULT_AUTHENTICATION_CLASSES": [],
    "DEFAULT_PERMISSION_CLASSES": [],
    "UNAUTHENTICATED_USER": None,
    "EXCEPTION_HANDLER": "dlock.handlers.drf_exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "STRICT_JSON": True,
    "COERCE_DECIMAL_TO_STRING": False,
}

SPECTACULAR_SETTINGS = {
    "TITLE": "dlock",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    # Every documented error is the C3 envelope (dlock.schema adds it to every operation).
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "dlock.schema.envelope_errors_hook",
    ],
}

# Caller credentials (dlock.auth, docs/security.md): SHA-256 hashes only, `scope:sha256hex`
# entries, several valid at once for rotation. Empty: every /v1 call is 401 (fail closed).
DLOCK_CREDENTIAL_HASHES = env_credentials("DLOCK_CREDENTIALS")

# Lock semantics (C3 §3.3 / §3.8).
LOCK_BACKEND = env_str("LOCK_BACKEND", "pg")
if LOCK_BACKEND not in ("pg", "etcd"):
    raise ImproperlyConfigured(f"LOCK_BACKEND must be pg or etcd, got {LOCK_BACKEND!r}")
LOCK_SESSION_TTL_MS = env_int("LOCK_SESSION_TTL_MS", 10_000, minimum=1_000, maximum=60_000)
LOCK_DEFAULT_TTL_MS = env_int("LOCK_DEFAULT_TTL_MS", 10_000, minimum=1_000, maximum=60_000)
LOCK_MAX_TTL_MS = env_int("LOCK_MAX_TTL_MS", 60_000, minimum=1_000, maximum=60_000)
ETCD_URL = env_str("ETCD_URL", "http://127.0.0.1:2379")

# How long a request may wait, from when the role's proxy took it (its X-Request-Start stamp)
# until a gunicorn worker thread takes it, before it is shed with 503 OVERLOADED (dlock.admission).
SERVER_QUEUE_DEADLINE_MS = env_int("SERVER_QUEUE_DEADLINE_MS", 500, minimum=10)
# The role's proxy: a request's head must have arrived within this long, and a body may pause no
# longer between two reads, or the proxy closes the connection (deploy/nginx/; a slow or
# stalled client never reaches gunicorn).
SERVER_HEADER_TIMEOUT_MS = env_int("SERVER_HEADER_TIMEOUT_MS", 3_000, minimum=100, maximum=60_000)

# Database capacity and deadlines (failure-behavior.md "Capacity and deadlines").
DB_POOL_MAX = env_int("DB_POOL_MAX", 8, minimum=1)
DB_QUEUE_DEADLINE_MS = env_int("DB_QUEUE_DEADLINE_MS", 2_000, minimum=10)
DB_STATEMENT_TIMEOUT_MS = env_int("DB_STATEMENT_TIMEOUT_MS", 2_500, minimum=10)
# Waiters beyond this are refused at once (503 OVERLOADED), so a burst can't pile up threads.
DB_POOL_MAX_WAITING = env_int("DB_POOL_MAX_WAITING", 2 * DB_POOL_MAX, minimum=0)
# Executions of one statement text on a connection before psycopg prepares it (server-binding
# cursors only: dlock.prepared and the lock server's backend).
DB_PREPARE_THRESHOLD = 1


# django-prometheus' engine, its counting cursor class made once (dlock/pgbackend/base.py).
DB_ENGINE = "dlock.pgbackend"


# In production every database connection is TLS to a server the URL names, its certificate
# verified (sslmode=verify-full, as k8s/ gives it); any other URL is refused at start-up, and no
# setting lifts that. A Unix-socket host is refused too: libpq speaks no TLS on a socket (it
# ignores sslmode there), so nothing would verify the server, and the environment decides whether
# libpq uses the socket at all (PGHOSTADDR or a PGSERVICE entry's hostaddr turns it into TCP,
# in clear text without verify-full). So is a URL that names no host (libpq takes PGHOST).
def unverified_database(config: dict) -> str | None:
    """Why libpq could reach the database of this DATABASES entry without verifying the server
    over TLS, as the end of a one-line refusal; None when it cannot."""
    options = config["OPTIONS"]
    if options.get("sslmode") != "verify-full":
        return "must carry sslmode=verify-full (and sslrootcert)"
    # Django's backend gives libpq HOST (the URL's host) over OPTIONS' `host` (a query parameter).
    hosts = config["HOST"] or options.get("host", "")
    if not hosts:
        return "must name the database server's host (libpq would take PGHOST or a local socket)"
    # libpq: a host starting with "/" (a directory) or "@" (Linux's abstract namespace) is a
    # Unix socket; a comma-separated list is tried in order.
    if any(host.strip().startswith(("/", "@")) for host in hosts.split(",")):
        return "must name a TCP host, not a Unix socket (a socket carries no TLS to verify)"
    return None


def database(url_env: str) -> dict:
    """One pooled PostgreSQL alias with the request deadline applied server-side; Django's
    PostgreSQL backend as django-prometheus wraps it (the django_db_* metrics)."""
    config = env_database(url_env)
    if DLOCK_ENVIRONMENT == "production" and (refused := unverified_database(config)):
        raise ImproperlyConfigured(
            f"{url_env} {refused} when DLOCK_ENVIRONMENT=production: the database's "
            "certificate is verified"
        )
    config["ENGINE"] = DB_ENGINE
    config["CONN_MAX_AGE"] = 0
    # With a pool, Django passes this on as psycopg_pool's `check` (dlock.pgbackend's
    # SweepingCheck): every connection is checked before the pool hands it out (a poll of its
    # socket; an empty query when the server wrote to it or closed it), so after a database
    # restart the pool discards its dead connections and connects anew instead of handing each
    # out once more and failing that request.
    config["CONN_HEALTH_CHECKS"] = True
    options = config["OPTIONS"]
    options["options"] = (
        f"-c statement_timeout={DB_STATEMENT_TIMEOUT_MS} -c lock_timeout={DB_STATEMENT_TIMEOUT_MS}"
        " -c idle_in_transaction_session_timeout=30000"
        # A killed worker's query is cancelled within 2 s instead of running on detached.
        " -c client_connection_check_interval=2000"
    )
    # Server-binding cursors (dlock.prepared, the lock server's backend) prepare a statement
    # the second time it runs on a connection; Django's client-binding ORM cursors never do.
    options["prepare_threshold"] = DB_PREPARE_THRESHOLD
    options["pool"] = {
        "min_size": 1,
        "max_size": DB_POOL_MAX,
        "timeout": DB_QUEUE_DEADLINE_MS / 1000,
        "max_waiting": DB_POOL_MAX_WAITING,
        "max_idle": 60,
    }
    return config


DATABASE_ROUTERS = ["dlock.dbrouter.AppDatabaseRouter"]
# app_label -> alias; anything absent goes to "default". Only the ops role needs entries.
APP_DATABASES: dict[str, str] = {}

LOG_LEVEL = env_str("DLOCK_LOG_LEVEL", "INFO")
# Where an operator's command run by manage.py writes its JSON events (docs/operations.md
# "Exit codes and output"): a file, appended, or "-" for stderr (a pod's log: the production
# default). `--log-json` sends one run's events to the terminal. The terminal itself gets only
# the command's human lines (or its --json answer).
DLOCK_EVENTS_LOG = env_str(
    "DLOCK_EVENTS_LOG",
    "-" if DLOCK_ENVIRONMENT == "production" else str(BASE_DIR / ".run/logs/ops-events.log"),
)


def logging_config(service: str) -> dict:
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": "dlock.logs.JsonFormatter", "service": service}},
        "handlers": {"stdout": {"class": "logging.StreamHandler", "formatter": "json"}},
        "filters": {"quiet_refusals": {"()": "dlock.logs.QuietRefusals"}},
        "root": {"handlers": ["stdout"], "level": LOG_LEVEL},
        "loggers": {
            # Refused Hosts and shed requests: aggregated events, never a line (or a
            # traceback) per request (dlock.logs.QuietRefusals).
            "django.request": {"level": "ERROR", "filters": ["quiet_refusals"]},
            "django.security.DisallowedHost": {"filters": ["quiet_refusals"]},
            "django.server": {"level": "WARNING"},
            "httpx": {"level": "WARNING"},
            "urllib3": {"level": "WARNING"},
        },
    }


def service_name(role: str) -> str:
    return SERVICE_NAMES[role]


# Lock server (docs/lockserver.md). Both backends read these.
# Tokens handed out by this deployment are always > LOCK_TOKEN_FLOOR (checked at start-up).
LOCK_TOKEN_FLOOR = env_int("LOCK_TOKEN_FLOOR", 0, minimum=0)
# Expired session records are kept this long so L2 can answer 410 (not 404) for them.
LOCK_SESSION_RETENTION_MS = env_int("LOCK_SESSION_RETENTION_MS", 86_400_000, minimum=60_000)
# Server-side acquire waits (waitMillis): at most this many waiters per key (32: the FIFO queue
# holds a hot key's 32 callers instead of sending 24 of them to back off; docs/performance.md) ...
LOCK_MAX_WAITERS_PER_KEY = env_int("LOCK_MAX_WAITERS_PER_KEY", 32, minimum=1)
# ... at most this many waiting acquires per process (each holds a worker thread; beyond it:
# 429 CONTENTION_EXCEEDED at once), well below GUNICORN_THREADS (64 for the lock server) ...
LOCK_MAX_WAITS_PER_PROCESS = env_int("LOCK_MAX_WAITS_PER_PROCESS", 40, minimum=1)
# ... and at most LOCK_RETRY_BUDGET contended attempts per (session, key) per window.
LOCK_RETRY_BUDGET = env_int("LOCK_RETRY_BUDGET", 20, minimum=1)
LOCK_RETRY_WINDOW_MS = env_int("LOCK_RETRY_WINDOW_MS", 10_000, minimum=100)
# Reaper period: expiry events, session retention, live gauges.
LOCK_HOUSEKEEPING_MS = env_int("LOCK_HOUSEKEEPING_MS", 1_000, minimum=50)
# retryAfterMillis of 503 NOT_LEADER when the etcd store is unreachable or has no leader.
LOCK_NOT_LEADER_RETRY_MS = env_int("LOCK_NOT_LEADER_RETRY_MS", 1_000, minimum=10, maximum=60_000)

# Payment resource (CHANGELOG row 75; docs/performance.md "The settlement row"). P3 credits
# `settlement:<currency>` into one of this many bucket rows, chosen from the payout id, so the
# posts of one currency do not queue on one row lock held through their commits' fsync; a
# settlement balance reads as the account row plus its buckets. 1 = one row takes every credit.
# Idempotency records are kept this long (and while their payout has not ended), then
# `manage.py purge_idempotency` deletes them (payments/retention.py, docs/operations.md).
IDEMPOTENCY_RETENTION_DAYS = env_int("IDEMPOTENCY_RETENTION_DAYS", 7, minimum=1)
PAY_SETTLEMENT_BUCKETS = env_int("PAY_SETTLEMENT_BUCKETS", 8, minimum=1, maximum=256)

# Service URLs for clients of our own hops (executor, revoke_lock, experiment).
LOCK_SERVER_URL = env_str("LOCK_SERVER_URL", "http://127.0.0.1:8081")
PAYMENTS_URL = env_str("PAYMENTS_URL", "http://127.0.0.1:8082")
RAIL_PROXY_URL = env_str("RAIL_PROXY_URL", "http://127.0.0.1:8083")
RAIL_STUB_URL = env_str("RAIL_STUB_URL", "http://127.0.0.1:8084")

# Rail proxy → rail stub (C3 §3.8 "rail-proxy → rail-stub": 1 s / 8 s, never retried). The sweep
# turns intents unresolved for longer than connect + read + margin into RAIL_AMBIGUOUS.
RAIL_CONNECT_TIMEOUT_MS = env_int("RAIL_CONNECT_TIMEOUT_MS", 1_000, minimum=1, maximum=60_000)
RAIL_READ_TIMEOUT_MS = env_int("RAIL_READ_TIMEOUT_MS", 8_000, minimum=1, maximum=60_000)
RAIL_SWEEP_INTERVAL_MS = env_int("RAIL_SWEEP_INTERVAL_MS", 5_000, minimum=100)
RAIL_SWEEP_MARGIN_MS = env_int("RAIL_SWEEP_MARGIN_MS", 2_000, minimum=0)
RAIL_SWEEP_ENABLED = env_bool("RAIL_SWEEP_ENABLED", True)
# A rail answer that arrives while paydb cannot be reached (a restart, a failover): its
# recording (never the rail call) is tried again for this long before the intent is left to the
# sweep. 5 s: a fast restart takes about one; the forward (≤ 9 s) plus this stays within the
# proxy's longest request (dlock.budgets.LONGEST_REQUEST_S, 15 s).
RAIL_RECORD_RETRY_MS = env_int("RAIL_RECORD_RETRY_MS", 5_000, minimum=0, maximum=6_000)

# etcd lock backend (LOCK_BACKEND=etcd, docs/lockserver-etcd.md). Short timeouts: an unreachable
# or leaderless member answers 503 NOT_LEADER within about a second, never a hang.
ETCD_PREFIX = env_str("ETCD_PREFIX", "dlock/")
ETCD_CONNECT_TIMEOUT_MS = env_int("ETCD_CONNECT_TIMEOUT_MS", 500, minimum=10, maximum=10_000)
ETCD_REQUEST_TIMEOUT_MS = env_int("ETCD_REQUEST_TIMEOUT_MS", 400, minimum=10, maximum=30_000)
# On etcd, the PostgreSQL backend's last token (lockdb's fencing_token_seq, when present) is a
# floor too, so a pg → etcd switch keeps tokens increasing even without LOCK_TOKEN_FLOOR.
LOCK_TOKEN_FLOOR_FROM_PG = env_bool("LOCK_TOKEN_FLOOR_FROM_PG", True)
# etcd: tokens reserved in lockdb per write. At least half a block is always
# reserved ahead, which is how many tokens (etcd revisions) the lock-server can issue while
# lockdb is unreachable; a switch of backend or cluster skips at most one block.
LOCK_TOKEN_RESERVE_BLOCK = env_int("LOCK_TOKEN_RESERVE_BLOCK", 10_000, minimum=10)
