"""The union of every role's routes (paths never collide), for tests and the ops role."""

from django.contrib import admin
from django.urls import include, path

from dlock.urls import common_patterns, handler400, handler403, handler404, handler500  # noqa: F401

urlpatterns = [
    path("", include("lockserver.routes")),
    path("", include("payments.routes")),
    path("", include("railproxy.routes")),
    path("", include("railstub.routes")),
    path("admin/", admin.site.urls),
    *common_patterns(),
]
