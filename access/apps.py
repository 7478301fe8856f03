from django.apps import AppConfig


class AccessConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "access"
    verbose_name = "Access"

    def ready(self) -> None:
        from access import signals  # noqa: F401  (who loses access is told at once)
