"""ROOT_URLCONF of ROLE=lockserver."""

from dlock.urls import common_patterns, handler400, handler403, handler404, handler500  # noqa: F401
from lockserver import routes

# The app's routes directly, not through include(""): one resolver level less on every request
# (same patterns, names and routes; the ops URLconf includes lockserver.routes as before).
urlpatterns = [*routes.urlpatterns, *common_patterns()]
