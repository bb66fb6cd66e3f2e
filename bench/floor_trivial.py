"""A bench-only WSGI app that reads the body and answers a fixed JSON document: gunicorn's own
cost per request under the roles' config (`bench.payout_floor` measures it).

    gunicorn -c settings/gunicorn.py bench.floor_trivial
"""

from __future__ import annotations

_BODY = b'{"fencingToken":1,"fencingProof":"v1.k.x"}'
_HEADERS = [
    ("Content-Type", "application/json; charset=utf-8"),
    ("Content-Length", str(len(_BODY))),
]


def application(environ, start_response):
    length = int(environ.get("CONTENT_LENGTH") or 0)
    if length:
        environ["wsgi.input"].read(length)
    start_response("200 OK", _HEADERS)
    return [_BODY]
