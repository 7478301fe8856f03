"""The transport's own counters; exposed with the processes' other metrics (terminals.metrics)."""

from __future__ import annotations

from prometheus_client import Counter

LAYER_ERRORS = Counter(
    "tether_channel_layer_errors_total",
    "Sends or receives on the channel layer that failed",
    ["where"],
    registry=None,
)
