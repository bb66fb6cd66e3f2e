from django.apps import AppConfig


class ExperimentConfig(AppConfig):
    name = "experiment"
    verbose_name = "fencing experiment"
