"""HTTP routes of the railproxy app (included by its role URLconf and by the ops URLconf)."""

from django.urls import path

from railproxy.views import SubmissionView

urlpatterns: list = [
    path("v1/rail/submissions", SubmissionView.as_view(), name="rail-submissions"),
]
