"""Health for the balancer and the supervisor: ``/healthz`` (this process answers) and ``/readyz`` (and can
reach what it needs: PostgreSQL, and the channel layer, which is Redis when there is one). Neither needs a
login nor says more than which dependency is down."""

from __future__ import annotations

import asyncio
import time

from channels.db import database_sync_to_async as db
from channels.layers import get_channel_layer
from django.db import connection
from django.http import JsonResponse
from django.views.decorators.cache import never_cache

from terminals.layers import forget_channel

CHECK_SECONDS = 2.0


@never_cache
async def healthz(request) -> JsonResponse:
    return JsonResponse({"status": "ok"})


def _database() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")


async def _channel_layer() -> None:
    """A message to a channel of our own and back: the round trip every viewer and worker relies on."""
    layer = get_channel_layer()
    channel = await layer.new_channel("tether.ready.")
    try:
        await layer.send(channel, {"type": "ready.ping"})
        await layer.receive(channel)
    finally:
        await forget_channel(layer, channel)


async def _timed(check) -> str:
    started = time.monotonic()
    try:
        await asyncio.wait_for(check(), CHECK_SECONDS)
    except Exception as error:  # down, or too slow to count on
        return f"failing: {type(error).__name__}"
    return f"ok ({(time.monotonic() - started) * 1000:.0f} ms)"


@never_cache
async def readyz(request) -> JsonResponse:
    checks = {"database": await _timed(db(_database)), "channel_layer": await _timed(_channel_layer)}
    ready = all(value.startswith("ok") for value in checks.values())
    return JsonResponse({"status": "ready" if ready else "not ready", "checks": checks}, status=200 if ready else 503)
