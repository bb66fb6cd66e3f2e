"""ROOT_URLCONF of ROLE=railproxy."""

from django.urls import include, path

from dlock.urls import common_patterns, handler400, handler403, handler404, handler500  # noqa: F401

urlpatterns = [path("", include("railproxy.routes")), *common_patterns()]
