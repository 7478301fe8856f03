"""Every channel-layer message has a size cap, on each layer Tether can run on (real Redis)."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from terminals.layers import (
    CappedInMemoryLayer,
    CappedPubSubLayer,
    CappedRedisLayer,
    CappedRedisPubSubLayer,
    MessageTooLarge,
)
from tests.bridge.harness import REDIS_URL


def make_layer(kind: str):
    prefix = f"tether-test-{uuid.uuid4().hex[:8]}"
    if kind == "pubsub":
        return CappedRedisPubSubLayer(hosts=[REDIS_URL], prefix=prefix)
    if kind == "channels-pubsub":
        return CappedPubSubLayer(hosts=[{"address": REDIS_URL}], prefix=prefix)
    if kind == "core":
        return CappedRedisLayer(hosts=[{"address": REDIS_URL, "socket_timeout": 15}], prefix=prefix)
    return CappedInMemoryLayer()


@pytest.mark.parametrize("kind", ["pubsub", "channels-pubsub", "core", "memory"])
async def test_a_message_over_the_cap_is_refused_and_the_channel_carries_on(settings, kind):
    settings.TETHER_LAYER_MESSAGE_BYTES = 128 * 1024
    layer = make_layer(kind)
    channel = await layer.new_channel()
    receiving = asyncio.ensure_future(layer.receive(channel))  # subscribed before anything is sent
    await asyncio.sleep(0.2)
    try:
        with pytest.raises(MessageTooLarge, match=r"terminal.output of \d+ bytes is over the 131072-byte"):
            await layer.send(channel, {"type": "terminal.output", "data": b"x" * (128 * 1024)})
        with pytest.raises(MessageTooLarge):
            await layer.group_add("viewers", channel)
            await layer.group_send("viewers", {"type": "terminal.output", "data": b"x" * (200 * 1024)})
        # Just under the cap still travels, and it is the first thing the channel receives.
        fits = b"y" * (127 * 1024)
        await layer.send(channel, {"type": "terminal.output", "data": fits})
        message = await asyncio.wait_for(receiving, 10)
        assert message["data"] == fits
    finally:
        receiving.cancel()
        if hasattr(layer, "flush"):
            await layer.flush()
