from django.apps import AppConfig


class RailstubConfig(AppConfig):
    name = "railstub"
