"""HTTP routes of the railstub app (included by its role URLconf and by the ops URLconf)."""

from django.urls import path

from railstub.views import SubmitView

urlpatterns: list = [path("submit", SubmitView.as_view(), name="railstub-submit")]
