import sys

from django.apps import AppConfig


def _command() -> str | None:
    """The management command this process runs (`manage.py migrate` → "migrate"), if any."""
    return sys.argv[1] if len(sys.argv) > 1 and not sys.argv[1].startswith("-") else None


class DlockConfig(AppConfig):
    name = "dlock"
    verbose_name = "dlock shared kernel"

    def ready(self) -> None:
        from django.conf import settings

        from dlock import metrics, proof

        proof.check_configured(settings.ROLE, _command())
        metrics.register_role_metrics(settings.ROLE, backend=settings.LOCK_BACKEND)
        if "axes" in settings.INSTALLED_APPS:  # the admin's login audit trail (ROLE=admin)
            from dlock import adminpages

            adminpages.connect_audit_log()
