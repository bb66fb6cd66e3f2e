"""HTTP routes of the railstub app (included by its role URLconf and by the ops URLconf)."""

from django.urls import path

from dlock.hotview import hot_view
from railstub.views import SubmitView, submit

urlpatterns: list = [path("submit", hot_view(SubmitView, post=submit), name="railstub-submit")]
