from django.apps import AppConfig


class DlockConfig(AppConfig):
    name = "dlock"
    verbose_name = "dlock shared kernel"

    def ready(self) -> None:
        from django.conf import settings

        from dlock import metrics, proof

        proof.check_configured(settings.ROLE)
        metrics.register_role_metrics(settings.ROLE, backend=settings.LOCK_BACKEND)
        if "axes" in settings.INSTALLED_APPS:  # the admin's login audit trail (ROLE=payments)
            from dlock import adminpages

            adminpages.connect_audit_log()
