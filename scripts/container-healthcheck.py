"""Docker HEALTHCHECK: a server role answers /health/live; other roles have no HTTP listener."""

import os
import sys
import urllib.request

SERVERS = {"lockserver", "payments", "railproxy", "railstub", "admin"}

if os.environ.get("ROLE") not in SERVERS:
    sys.exit(0)
url = f"http://127.0.0.1:{os.environ.get('PORT', '8080')}/health/live"
try:
    with urllib.request.urlopen(url, timeout=2) as response:
        sys.exit(0 if response.status == 200 else 1)
except OSError:
    sys.exit(1)
