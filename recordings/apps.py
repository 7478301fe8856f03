from django.apps import AppConfig


class RecordingsConfig(AppConfig):
    name = "recordings"

    def ready(self) -> None:
        from recordings import signals  # noqa: F401 - ends the share links whose maker lost access
