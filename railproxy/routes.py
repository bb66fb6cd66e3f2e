"""HTTP routes of the railproxy app (included by its role URLconf and by the ops URLconf)."""

from django.urls import path

from dlock.hotview import hot_view
from railproxy.views import SubmissionView, submit

urlpatterns: list = [
    path("v1/rail/submissions", hot_view(SubmissionView, post=submit), name="rail-submissions"),
]
