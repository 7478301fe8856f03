"""The transport's own counters; exposed with the processes' other metrics (terminals.metrics)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

LAYER_ERRORS = Counter(
    "tether_channel_layer_errors_total",
    "Sends or receives on the channel layer that failed",
    ["where"],
    registry=None,
)

# Direct links between web processes and workers (transport/links.py)
LINKS = Gauge(
    "tether_links",
    "Links open now: dialled (a web process's, one per worker) or accepted (a worker's)",
    ["side"],
    registry=None,
)
LINK_BYTES = Counter("tether_link_bytes_total", "Bytes over the links, by direction", ["direction"], registry=None)
LINK_RECONNECTS = Counter(
    "tether_link_reconnects_total", "Links dialled again to a worker this process had a link to before", registry=None
)
LINK_FALLBACKS = Counter(
    "tether_link_fallbacks_total",
    "Messages for a worker's channel sent through Redis because no link to it could be made",
    registry=None,
)
LINK_REFUSED = Counter(
    "tether_link_refused_total",
    "Links refused: the dialling end did not prove it holds the worker's key, or (tls:) no TLS handshake completed",
    registry=None,
)
