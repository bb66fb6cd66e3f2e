"""gunicorn entry for the probe role (the real roles use settings.wsgi)."""

import os

os.environ["DJANGO_SETTINGS_MODULE"] = "tests.production.probe_settings"

from dlock.admission import wsgi_application

application = wsgi_application()
