"""HTTP routes of the railstub app (included by its role URLconf and by the ops URLconf)."""

urlpatterns: list = []
