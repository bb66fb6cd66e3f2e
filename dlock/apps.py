from django.apps import AppConfig


class DlockConfig(AppConfig):
    name = "dlock"
    verbose_name = "dlock shared kernel"

    def ready(self) -> None:
        from dlock import metrics  # noqa: F401  (declares every series at 0)
