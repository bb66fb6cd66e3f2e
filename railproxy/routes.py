"""HTTP routes of the railproxy app (included by its role URLconf and by the ops URLconf)."""

urlpatterns: list = []
