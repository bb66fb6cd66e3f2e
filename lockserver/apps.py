"""lockserver app."""

from django.apps import AppConfig


class LockserverConfig(AppConfig):
    name = "lockserver"

    def ready(self) -> None:
        from django.conf import settings

        if settings.ROLE != "lockserver":
            return
        from dlock.health import register_readiness_check
        from lockserver.backends import get_backend, start_up

        start_up()  # refuses to start, in one line, when the token floor cannot be made safe

        # Readiness builds the backend: the token floor is applied and the listener started
        # before the process is reported ready (start-up check of LOCK_TOKEN_FLOOR).
        register_readiness_check("lockBackend", lambda: get_backend().check_ready())
