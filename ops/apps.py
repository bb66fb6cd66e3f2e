from django.apps import AppConfig


class OpsConfig(AppConfig):
    """Operator tooling (ROLE=ops only): reconcile, revoke_lock, repair_fence."""

    name = "ops"
