"""ROOT_URLCONF of ROLE=admin: the Django admin, health and metrics; no /v1 route."""

from django.contrib import admin
from django.urls import path

from dlock.urls import handler400, handler403, handler404, handler500, monitoring_patterns  # noqa: F401

urlpatterns = [path("admin/", admin.site.urls), *monitoring_patterns()]
