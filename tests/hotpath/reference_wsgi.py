"""gunicorn entry for a role on tests.hotpath.reference_urls (the DRF reference, test-only)."""

from dlock.roles import configure_settings_module

configure_settings_module()

from django.conf import settings  # noqa: E402

settings.ROOT_URLCONF = "tests.hotpath.reference_urls"
# The reference keeps the page middleware for every path outside /v1, as before the rail
# stub's POST /submit became a machine path (settings.railstub.DLOCK_MACHINE_PATHS).
settings.DLOCK_MACHINE_PATHS = frozenset()

from dlock.admission import wsgi_application  # noqa: E402

application = wsgi_application()
