"""The admin role's URLconf (ROLE=admin, settings/admin.py): no app of its own; the pages are
the Django admin's, registered by the payments and railproxy apps (their admin.py)."""
