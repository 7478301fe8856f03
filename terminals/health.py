"""Health for the balancer and the supervisor: ``/healthz`` (this process answers) and ``/readyz`` (and can
reach what it needs: PostgreSQL, and the channel layer, which is Redis when there is one). Neither needs a
login nor says more than which dependency is down."""

from __future__ import annotations

import asyncio
import time

from channels.db import database_sync_to_async as db
from channels.layers import get_channel_layer
from django.db import connection
from django.http import HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache

from terminals import metrics as tether_metrics
from transport.layers import forget_channel

CHECK_SECONDS = 2.0


@never_cache
async def healthz(request) -> JsonResponse:
    return JsonResponse({"status": "ok"})


def database_check() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")


async def channel_layer_check() -> None:
    """A message to a channel of our own and back: the round trip every viewer and worker relies on."""
    layer = get_channel_layer()
    channel = await layer.new_channel("tether.ready.")
    try:
        await layer.send(channel, {"type": "ready.ping"})
        await layer.receive(channel)
    finally:
        await forget_channel(layer, channel)


async def timed(check) -> str:
    started = time.monotonic()
    try:
        await asyncio.wait_for(check(), CHECK_SECONDS)
    except Exception as error:  # down, or too slow to count on
        return f"failing: {type(error).__name__}"
    return f"ok ({(time.monotonic() - started) * 1000:.0f} ms)"


@never_cache
async def readyz(request) -> JsonResponse:
    checks = {"database": await timed(db(database_check)), "channel_layer": await timed(channel_layer_check)}
    ready = all(value.startswith("ok") for value in checks.values())
    return JsonResponse({"status": "ready" if ready else "not ready", "checks": checks}, status=200 if ready else 503)


@never_cache
def metrics(request) -> HttpResponse:
    """Prometheus exposition (terminals/metrics.py): loopback, or the bearer TETHER_METRICS_TOKEN."""
    # A request a balancer passed on comes from loopback too: it says so (X-Forwarded-For) and is not local.
    remote = "" if "X-Forwarded-For" in request.headers else request.META.get("REMOTE_ADDR", "")
    if not tether_metrics.allowed(remote, request.headers.get("Authorization", "")):
        return HttpResponse(
            "metrics are for loopback or a bearer TETHER_METRICS_TOKEN\n", status=403, content_type="text/plain"
        )
    tether_metrics.expose("web")
    return HttpResponse(tether_metrics.exposition(), content_type=tether_metrics.CONTENT_TYPE)
