from django.apps import AppConfig


class TerminalsConfig(AppConfig):
    name = "terminals"
