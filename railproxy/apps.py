from django.apps import AppConfig


class RailproxyConfig(AppConfig):
    name = "railproxy"
