from django.apps import AppConfig


class PaymentsConfig(AppConfig):
    name = "payments"

    def ready(self) -> None:
        from django.conf import settings

        if settings.ROLE == "payments":
            from payments.metrics import register_payments_collectors

            register_payments_collectors()
