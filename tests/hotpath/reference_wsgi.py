"""gunicorn entry for a role on tests.hotpath.reference_urls (the DRF reference, test-only)."""

from dlock.roles import configure_settings_module

configure_settings_module()

from django.conf import settings  # noqa: E402

settings.ROOT_URLCONF = "tests.hotpath.reference_urls"

from dlock.admission import wsgi_application  # noqa: E402

application = wsgi_application()
