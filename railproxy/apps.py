from django.apps import AppConfig


class RailproxyConfig(AppConfig):
    name = "railproxy"

    def ready(self) -> None:
        from railproxy import sweep

        sweep.maybe_start()  # only in the railproxy server process
