"""ROOT_URLCONF of ROLE=payments."""

from django.urls import include, path

from dlock.urls import common_patterns, handler400, handler403, handler404, handler500  # noqa: F401

urlpatterns = [path("", include("payments.routes")), *common_patterns()]
