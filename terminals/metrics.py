"""Prometheus metrics (docs/operations.md lists them with the alerts built on them).

Each process counts what it sees itself: a web process its viewers, reconnects, bytes replayed and lost,
the page's echo latency and its channel-layer errors; a worker the processes it holds, outcomes it
recorded, takeovers and recovery actions, and its heartbeat. Web processes also report what the database
says (sessions by state and backend, executions by state, the open ``unknown`` ones and the oldest's age):
the same figures from every web process, so aggregate those with ``max``.

A web process serves them at ``/metrics``; a worker with ``--http`` (or ``TETHER_WORKER_HTTP``) at
``/metrics`` of its own small server. Both answer only loopback, or a bearer ``TETHER_METRICS_TOKEN``.
"""

from __future__ import annotations

import hmac
import ipaddress
import threading
import time
from collections.abc import Iterable

from django.conf import settings
from django.db.models import Count, DurationField, ExpressionWrapper, F, Max
from django.db.models.functions import Now
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from transport import metrics as transport_metrics

CONTENT_TYPE = CONTENT_TYPE_LATEST

# Every metric is made unregistered, then exposed by the processes it is about (``expose``): a web process
# shows no heartbeat of its own, a worker no viewers.
_UNREGISTERED = {"registry": None}
ECHO_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
BEAT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

# --- web processes --------------------------------------------------------------------------------

VIEWERS = Gauge("tether_viewers", "Sockets attached to a shell now, by role", ["role"], **_UNREGISTERED)
RECONNECTS = Counter(
    "tether_attaches_total",
    "Attaches answered by the owner, by result: new (a first look), resumed (no byte missed), gap (bytes were "
    "no longer kept), snapshot (the screen was redrawn), fresh (a new owner restarted the stream)",
    ["result"],
    **_UNREGISTERED,
)
REPLAYED = Counter("tether_replayed_bytes_total", "Bytes sent again to a viewer that came back", **_UNREGISTERED)
LOST = Counter(
    "tether_gap_bytes_total",
    "Bytes a viewer that came back could no longer be sent (a gap it was told)",
    **_UNREGISTERED,
)
ECHO = Histogram(
    "tether_keystroke_echo_seconds",
    "From a key sent by the page to the next output it received, as the page measured it",
    buckets=ECHO_BUCKETS,
    **_UNREGISTERED,
)

# --- both -----------------------------------------------------------------------------------------

LAYER_ERRORS = transport_metrics.LAYER_ERRORS  # counted where the layer fails (transport/)
# Direct links between web processes and workers (transport/links.py): both ends count theirs.
LINKS = [
    transport_metrics.LINKS,
    transport_metrics.LINK_BYTES,
    transport_metrics.LINK_RECONNECTS,
    transport_metrics.LINK_FALLBACKS,
    transport_metrics.LINK_REFUSED,
]

# --- workers --------------------------------------------------------------------------------------

OUTCOMES = Counter("tether_outcomes_total", "Outcomes this worker recorded, by state", ["state"], **_UNREGISTERED)
TAKEOVERS = Counter("tether_lease_takeovers_total", "Expired leases this worker took over", **_UNREGISTERED)
RECOVERY = Counter("tether_recovery_actions_total", "What recovery passes did, by action", ["action"], **_UNREGISTERED)
HOLDERS_SWEPT = Counter(
    "tether_holders_swept_total",
    "Session holders that outlived their settled execution (its owner died before letting them go), ended by recovery",
    ["backend"],
    **_UNREGISTERED,
)
HEARTBEAT = Histogram(
    "tether_heartbeat_seconds", "How long a heartbeat's database round trip took", buckets=BEAT_BUCKETS, **_UNREGISTERED
)
HEARTBEAT_AGE = Gauge(
    "tether_heartbeat_age_seconds", "Seconds since this worker's last heartbeat that succeeded", **_UNREGISTERED
)
LAST_BEAT = {"at": time.monotonic()}
HEARTBEAT_AGE.set_function(lambda: time.monotonic() - LAST_BEAT["at"])


class HeldCollector(Collector):
    """The processes held by the workers of this process (one, or none), by backend and kind, at the scrape."""

    def __init__(self):
        self.contexts: list = []  # each running OwnerWorker's context (terminals.owner.context.WorkerContext)

    def collect(self) -> Iterable[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "tether_worker_processes", "Processes this worker holds, by backend and kind", labels=["backend", "kind"]
        )
        counts: dict[tuple[str, str], int] = {}
        for context in list(self.contexts):
            for live in list(context.live.values()):
                key = (live.handle_backend or "unknown", live.kind)
                counts[key] = counts.get(key, 0) + 1
        for (backend, kind), count in sorted(counts.items()):
            family.add_metric([backend, kind], count)
        yield family


HELD = HeldCollector()

GROUPS = {
    "web": [VIEWERS, RECONNECTS, REPLAYED, LOST, ECHO, LAYER_ERRORS, *LINKS],
    "worker": [OUTCOMES, TAKEOVERS, RECOVERY, HOLDERS_SWEPT, HEARTBEAT, HEARTBEAT_AGE, LAYER_ERRORS, HELD, *LINKS],
}
_exposed: set[int] = set()
_lock = threading.Lock()


def expose(group: str) -> None:
    """Export ``group``'s metrics from this process (again: nothing more). The embedded mode exposes both."""
    with _lock:
        for collector in GROUPS[group] + ([DatabaseCollector.instance()] if group == "web" else []):
            if id(collector) not in _exposed:
                REGISTRY.register(collector)
                _exposed.add(id(collector))


def beat_done(seconds: float) -> None:
    HEARTBEAT.observe(seconds)
    LAST_BEAT["at"] = time.monotonic()


def echo_samples(values: object) -> int:
    """Keystroke-echo samples from a page's ping (milliseconds): each within 0..60 s is counted, the rest and
    anything not a number dropped. At most 50 a ping. Returns how many were counted."""
    if not isinstance(values, list):
        return 0
    counted = 0
    for value in values[:50]:
        if isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value <= 60_000:
            ECHO.observe(value / 1000)
            counted += 1
    return counted


# --- what the database says (web processes) ----------------------------------------------------------


class DatabaseCollector(Collector):
    """Read at each scrape: a few grouped counts, no per-row work."""

    _instance: DatabaseCollector | None = None

    @classmethod
    def instance(cls) -> DatabaseCollector:
        if cls._instance is None:
            cls._instance = cls()
        return cls._instance

    def collect(self) -> Iterable[GaugeMetricFamily]:
        from executions.models import Execution, State
        from terminals.models import TerminalSession

        sessions = GaugeMetricFamily(
            "tether_sessions", "Terminal sessions by process state and backend", labels=["state", "backend"]
        )
        for row in TerminalSession.objects.values("process_state", "machine__backend").annotate(n=Count("id")):
            sessions.add_metric([row["process_state"], row["machine__backend"]], row["n"])
        yield sessions
        executions = GaugeMetricFamily("tether_executions", "Executions by state", labels=["state"])
        counts = dict(Execution.objects.values_list("state").annotate(n=Count("id")))
        for state in State.values:
            executions.add_metric([state], counts.get(state, 0))
        yield executions
        waited = ExpressionWrapper(Now() - F("ended_at"), output_field=DurationField())  # the database's clock
        oldest = Execution.objects.filter(state=State.UNKNOWN).aggregate(age=Max(waited))["age"]
        age = oldest.total_seconds() if oldest else 0.0
        yield GaugeMetricFamily(
            "tether_unknown_oldest_seconds", "How long the oldest unknown outcome has waited for an operator", value=age
        )


def exposition() -> bytes:
    return generate_latest(REGISTRY)


def allowed(remote_addr: str, authorization: str) -> bool:
    """Loopback, or the bearer ``TETHER_METRICS_TOKEN`` when one is set (compared in constant time)."""
    token = settings.TETHER_METRICS_TOKEN
    if token and authorization.startswith("Bearer "):
        return hmac.compare_digest(authorization.removeprefix("Bearer ").strip().encode(), token.encode())
    try:
        return ipaddress.ip_address(remote_addr).is_loopback
    except ValueError:
        return False


class ViewerCount:
    """One viewer's part in the figures an operator watches: what it is (``VIEWERS`` by role), how it came back."""

    def __init__(self) -> None:
        self.role: str | None = None

    def attached(self, message, asked_from: int | None) -> None:
        """Attached (a ``terminals.protocol.Attached``), having asked from ``asked_from`` (None: a new viewer)."""
        if message.lost:
            result = "gap"
        elif message.screen:
            result = "snapshot"
        elif message.fresh:
            result = "fresh"
        else:
            result = "new" if asked_from is None else "resumed"
        RECONNECTS.labels(result).inc()
        REPLAYED.inc(max(message.end - message.offset, 0))
        LOST.inc(max(message.lost, 0))
        self.count_as(message.role)

    def left(self) -> None:
        self.count_as(None)

    def count_as(self, role: str | None) -> None:
        if role != self.role:
            if self.role:
                VIEWERS.labels(self.role).dec()
            if role:
                VIEWERS.labels(role).inc()
            self.role = role
