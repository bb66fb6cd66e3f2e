"""A bench-only WSGI app that does nothing: what gunicorn alone costs per request (bench.worker).

gunicorn -c settings/gunicorn.py bench.trivial_app
"""

from __future__ import annotations

_BODY = b'{"status":"UP"}'
_HEADERS = [("Content-Type", "application/json"), ("Content-Length", str(len(_BODY)))]


def application(environ, start_response):
    start_response("200 OK", _HEADERS)
    return [_BODY]
