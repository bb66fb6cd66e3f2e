"""WSGI entry point for gunicorn: `ROLE=payments gunicorn -c settings/gunicorn.py settings.wsgi`."""

from dlock.roles import configure_settings_module

configure_settings_module()

from dlock.admission import wsgi_application  # noqa: E402

application = wsgi_application()
