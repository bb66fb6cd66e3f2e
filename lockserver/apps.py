from django.apps import AppConfig


class LockserverConfig(AppConfig):
    name = "lockserver"
