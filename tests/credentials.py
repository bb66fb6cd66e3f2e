"""Caller credentials for the whole suite, set up once before Django reads its settings.

Every server a test starts inherits DLOCK_CREDENTIALS (hashes of the two test credentials), and
every way a test talks HTTP to a dlock `/v1` path sends a credential without being asked to:
`requests` (any session, any helper), Django's test client and `tests.conftest.raw_request`.
The operator credential goes to L8 (`/v1/locks/<key>/revoke`), the executor one everywhere
else. A test that wants to send another credential, or none, says so: an explicit
`Authorization` header (None or "" for none) is left alone.
"""

from __future__ import annotations

import os
import re
from urllib.parse import urlsplit

from dlock.auth import credentials_entry, new_credential

EXECUTOR = os.environ.setdefault("DLOCK_EXECUTOR_CREDENTIAL", new_credential())
OPERATOR = os.environ.setdefault("DLOCK_OPERATOR_CREDENTIAL", new_credential())
CREDENTIALS = ",".join(
    [credentials_entry(EXECUTOR, "executor"), credentials_entry(OPERATOR, "operator")]
)
os.environ.setdefault("DLOCK_CREDENTIALS", CREDENTIALS)

_OPERATOR_PATH = re.compile(r"/v1/locks/[^/?]+/revoke(?:\?|$)")


def default_authorization(path: str) -> str:
    credential = OPERATOR if _OPERATOR_PATH.search(path) else EXECUTOR
    return f"Bearer {credential}"


def install() -> None:
    import requests
    from django.test.client import RequestFactory

    original_request = requests.Session.request

    def request(self, method, url, *args, headers=None, **kwargs):
        headers = dict(headers or {})
        if (
            urlsplit(str(url)).path.startswith("/v1/")  # dlock's API only: never etcd's gateway
            and not any(name.lower() == "authorization" for name in headers)
            and "Authorization" not in (self.headers or {})
        ):
            headers["Authorization"] = default_authorization(str(url))
        headers = {name: value for name, value in headers.items() if value != ""}
        return original_request(self, method, url, *args, headers=headers, **kwargs)

    requests.Session.request = request

    original_environ = RequestFactory._base_environ

    def base_environ(self, **request):
        environ = original_environ(self, **request)
        if "HTTP_AUTHORIZATION" not in environ:
            environ["HTTP_AUTHORIZATION"] = default_authorization(environ.get("PATH_INFO", ""))
        elif not environ["HTTP_AUTHORIZATION"]:
            del environ["HTTP_AUTHORIZATION"]
        return environ

    RequestFactory._base_environ = base_environ


def with_authorization(payload: bytes) -> bytes:
    """A raw HTTP request with the default Authorization header added after its request line
    (unless it has one, or is not a request with a head)."""
    line, sep, rest = payload.partition(b"\r\n")
    if not sep or b"authorization:" in payload.lower() or b"\r\n\r\n" not in payload:
        return payload
    parts = line.split(b" ")
    path = parts[1].decode("latin-1") if len(parts) == 3 else ""
    header = f"Authorization: {default_authorization(path)}\r\n".encode()
    return line + sep + header + rest
