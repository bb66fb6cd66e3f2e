"""HTTP routes of the payments app (included by its role URLconf and by the ops URLconf).

Exactly the five C3 §3.4 paths (the staff admin is ROLE=admin: admin/urls.py).
"""

from django.urls import path

from dlock.hotview import hot_read_view, hot_view
from payments import views

urlpatterns = [
    path(
        "v1/payouts",
        hot_read_view(views.PayoutListView, get=views.list_payouts),
        name="payouts-list",
    ),
    path(
        "v1/payouts/<str:payout_id>",
        hot_read_view(views.PayoutDetailView, get=views.get_payout),
        name="payout-detail",
    ),
    path(
        "v1/payouts/<str:payout_id>/claim",
        hot_view(views.PayoutClaimView, post=views.claim),
        name="payout-claim",
    ),
    path(
        "v1/payouts/<str:payout_id>/post",
        hot_view(views.PayoutPostView, post=views.post),
        name="payout-post",
    ),
    path("v1/accounts/<str:account_id>", views.AccountDetailView.as_view(), name="account-detail"),
]
