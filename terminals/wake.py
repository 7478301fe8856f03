"""The owner workers' wake-up channel: a nudge that pending work exists, never the work itself."""

from __future__ import annotations

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

WAKE_CHANNEL = "tether.worker.wake"


def wake_workers() -> None:
    """Nudge idle owner workers; a lost wake-up only costs one poll interval."""
    try:
        async_to_sync(get_channel_layer().send)(WAKE_CHANNEL, {"type": "wake"})
    except Exception:  # a full wake channel already holds a wake-up
        pass
