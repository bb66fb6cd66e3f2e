"""WSGI entry point for gunicorn: `ROLE=payments gunicorn -c settings/gunicorn.py settings.wsgi`."""

from dlock.roles import configure_settings_module

configure_settings_module()

from django.core.wsgi import get_wsgi_application  # noqa: E402

application = get_wsgi_application()
