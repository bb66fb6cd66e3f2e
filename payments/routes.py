"""HTTP routes of the payments app (included by its role URLconf and by the ops URLconf)."""

urlpatterns: list = []
