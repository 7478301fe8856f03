from django.apps import AppConfig


class TerminalsConfig(AppConfig):
    name = "terminals"

    def ready(self) -> None:
        from terminals import signals  # noqa: F401 - connects the submission and logout receivers
