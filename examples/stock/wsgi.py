"""WSGI entry point of the stock service (gunicorn examples.stock.wsgi:application)."""

from __future__ import annotations

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "examples.stock.settings")
application = get_wsgi_application()
