"""gunicorn settings for every server role (ROLE picks the app; PORT the listener)."""

import os

_role = os.environ.get("ROLE", "")
bind = f"{os.environ.get('BIND_HOST', '127.0.0.1')}:{os.environ.get('PORT', '8080')}"
# One process per role: metrics stay in-process and the GIL caps a process at one core anyway;
# threads serve concurrent requests and the lock-server's bounded waits (waitMillis).
workers = int(os.environ.get("GUNICORN_WORKERS", "1"))
worker_class = "gthread"
threads = int(os.environ.get("GUNICORN_THREADS", "32" if _role == "lockserver" else "16"))
# Above the longest legitimate request: rail read timeout 8 s plus the proxy's own work.
timeout = int(os.environ.get("GUNICORN_TIMEOUT", "40"))
graceful_timeout = int(os.environ.get("GUNICORN_GRACEFUL_TIMEOUT", "20"))
keepalive = 5
limit_request_line = 4094
limit_request_fields = 50
limit_request_field_size = 4096
accesslog = None
errorlog = "-"
loglevel = "warning"
proc_name = f"dlock-{_role}"
