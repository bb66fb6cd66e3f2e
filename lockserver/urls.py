"""ROOT_URLCONF of ROLE=lockserver."""

from django.urls import include, path

from dlock.urls import common_patterns, handler400, handler403, handler404, handler500  # noqa: F401

urlpatterns = [path("", include("lockserver.routes")), *common_patterns()]
