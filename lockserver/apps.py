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
        if settings.LOCK_BACKEND == "etcd":
            # etcd holds sessions and grants; lockdb only backs the token reservation, so the
            # lock-server stays ready through a lockdb outage while reserved tokens remain.
            from dlock.dbrouter import alias_for
            from dlock.health import replace_database_check

            replace_database_check(alias_for("lockserver"), lambda: get_backend().check_lockdb())
