"""The role's own URLconf with every hot route served by its DRF class again (test-only).

The differential test (test_differential.py) sends each request to a role process on this
URLconf and to one on the real URLconf: same route names, same middleware, same database, so
the only difference left is the plain view (dlock.hotview) against the DRF class it replaced.
"""

from __future__ import annotations

import importlib

from django.conf import settings

from tests.hotpath.routes import reference_patterns

ROLE_URLCONFS = {
    "lockserver": "lockserver.urls",
    "payments": "payments.urls",
    "railproxy": "railproxy.urls",
    "railstub": "railstub.urls",
}


_role = importlib.import_module(ROLE_URLCONFS[settings.ROLE])
urlpatterns = reference_patterns(_role.urlpatterns)
handler400 = _role.handler400
handler403 = _role.handler403
handler404 = _role.handler404
handler500 = _role.handler500
