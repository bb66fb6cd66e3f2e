"""HTTP routes of the lockserver app (included by its role URLconf and by the ops URLconf)."""

urlpatterns: list = []
