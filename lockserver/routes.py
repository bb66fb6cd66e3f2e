"""HTTP routes of the lockserver app (C3 §3.3 L1–L8; included by its role URLconf and ops)."""

from django.urls import path

from dlock.hotview import hot_view
from lockserver import views

urlpatterns = [
    path("v1/sessions", views.SessionsView.as_view(), name="lock-sessions"),
    path("v1/fencing-keys", views.FencingKeysView.as_view(), name="fencing-keys"),
    path(
        "v1/sessions/<str:session_id>/heartbeat",
        views.HeartbeatView.as_view(),
        name="lock-session-heartbeat",
    ),
    path("v1/sessions/<str:session_id>", views.SessionView.as_view(), name="lock-session"),
    path(
        "v1/locks/<str:key>/acquire",
        hot_view(views.AcquireView, post=views.acquire),
        name="lock-acquire",
    ),
    path(
        "v1/locks/<str:key>/renew", hot_view(views.RenewView, post=views.renew), name="lock-renew"
    ),
    path("v1/locks/<str:key>/revoke", views.RevokeView.as_view(), name="lock-revoke"),
    path("v1/locks/<str:key>", hot_view(views.LockView, delete=views.release), name="lock"),
]
