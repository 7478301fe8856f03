"""What the backends need to know of the install, passed in: the backends import no Django. The app installs
a provider (terminals.apps) that reads Django's settings each time it is asked, so a setting changed at run
time (a test's) is seen at once; without one (a script, a bench), the defaults below."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class HolderConfig:
    enabled: bool = True  # TETHER_HOLDER: shells are held by the session holder where it can run
    binary: str = "build/tether-holder"  # TETHER_HOLDER_BINARY
    directory: str = "/tmp/tether-held"  # TETHER_HOLDER_DIR: local holders' directories
    ring_bytes: int = 1024 * 1024  # TETHER_HOLDER_RING_BYTES
    buffer_bytes: int = 512 * 1024  # TETHER_BUFFER_BYTES: the worker's own buffer, which the ring must fit
    screens: bool = False  # TETHER_SCREEN_SCROLLBACK > 0: the ring also holds what came since the screen last kept


_provider: Callable[[], HolderConfig] = HolderConfig


def configure(provider: Callable[[], HolderConfig]) -> None:
    global _provider
    _provider = provider


def holder_config() -> HolderConfig:
    return _provider()
