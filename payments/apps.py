from django.apps import AppConfig
from django.conf import settings


class PaymentsConfig(AppConfig):
    name = "payments"

    def ready(self) -> None:
        if settings.ROLE == "payments":
            from payments import books_metrics
            from payments.metrics import register_payments_collectors
            from payments.reconcile_metrics import register

            register_payments_collectors()  # payouts_in_state
            register()  # reconcile_ok, reconcile_last_run_timestamp_seconds, fence_repaired_total
            books_metrics.register()  # payout backlog age, open rail recoveries and their age
