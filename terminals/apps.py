from django.apps import AppConfig


class TerminalsConfig(AppConfig):
    name = "terminals"

    def ready(self) -> None:
        from django.conf import settings

        from terminals import signals  # noqa: F401 - connects the submission and logout receivers
        from terminals.backends import config

        def holder_config() -> config.HolderConfig:  # read when asked: a setting changed at run time is seen
            return config.HolderConfig(
                enabled=settings.TETHER_HOLDER,
                binary=settings.TETHER_HOLDER_BINARY,
                directory=settings.TETHER_HOLDER_DIR,
                ring_bytes=settings.TETHER_HOLDER_RING_BYTES,
                buffer_bytes=settings.TETHER_BUFFER_BYTES,
                screens=settings.TETHER_SCREEN_SCROLLBACK > 0,
            )

        config.configure(holder_config)
