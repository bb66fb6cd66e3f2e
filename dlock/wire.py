"""Response constants every answer shares, whoever writes it: Django, the admission layer in
front of it, or the role's proxy (deploy/nginx/envelope-headers.conf, checked equal).
Standard library only."""

JSON_CONTENT_TYPE = "application/json; charset=utf-8"

# Probes and scrapes: never shed by the queue deadline (dlock.admission).
MONITORING_PATHS = frozenset({"/metrics", "/health/live", "/health/ready"})
# The methods a dlock role implements; anything else is 405 at the proxy (deploy/nginx/) and
# 501 in Django if it gets that far (a method name is client-chosen text and must never become a
# metric label value).
KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})

# Every response: nothing may frame it or sniff it.
SECURITY_HEADERS = {"X-Frame-Options": "DENY", "X-Content-Type-Options": "nosniff"}
# A JSON answer is data, never a page: nothing may run it or cache it either.
JSON_SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; frame-ancestors 'none'",
    "Cache-Control": "no-store",
}


def raw_json_headers(body: bytes) -> dict[str, str]:
    """Headers of a JSON answer written without Django (which adds them in secure_headers)."""
    return {
        "Content-Type": JSON_CONTENT_TYPE,
        "Content-Length": str(len(body)),
        **SECURITY_HEADERS,
        **JSON_SECURITY_HEADERS,
    }
