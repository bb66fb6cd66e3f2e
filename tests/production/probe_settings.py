"""The rail-stub role's settings with a probe URLconf: kernel behaviour under gunicorn, no app."""

from settings.railstub import *  # noqa: F403

ROOT_URLCONF = "tests.production.probe_urls"
