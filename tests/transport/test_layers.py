"""Every channel-layer message has a size cap, on each layer Tether can run on (real Redis)."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from tests.bridge.harness import REDIS_URL
from transport.layers import (
    CappedInMemoryLayer,
    CappedPubSubLayer,
    CappedRedisLayer,
    CappedRedisPubSubLayer,
    MessageTooLarge,
)


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


@pytest.mark.parametrize("size", [128 * 1024 - 40, 128 * 1024 - 32, 128 * 1024 - 31, 128 * 1024])
async def test_the_embedded_layer_refuses_exactly_what_redis_would(settings, size):
    """It packs a message only when a bound on its size could pass the cap: the refusal is still taken on
    the msgpack size the Redis layers send, to the byte."""
    import msgpack

    settings.TETHER_LAYER_MESSAGE_BYTES = 128 * 1024
    layer = CappedInMemoryLayer()
    channel = await layer.new_channel()
    message = {"type": "terminal.output", "data": b"z" * size}
    packed = len(msgpack.packb(message))
    if packed > 128 * 1024:
        with pytest.raises(MessageTooLarge):
            await layer.send(channel, message)
    else:
        await layer.send(channel, message)
        assert (await layer.receive(channel))["data"] == message["data"]


async def test_the_embedded_layer_hands_each_receiver_its_own_message():
    """A receiver changing what it got changes nothing for the sender or another receiver, nested or flat."""
    layer = CappedInMemoryLayer()
    first, second = await layer.new_channel(), await layer.new_channel()
    for channel in (first, second):
        await layer.group_add("viewers", channel)
    nested = {"type": "terminal.watchers", "names": ["ann"], "at": 1}
    flat = {"type": "terminal.output", "offset": 5, "data": b"hi"}
    await layer.group_send("viewers", nested)
    await layer.send(first, flat)
    got = await layer.receive(first)
    got["names"].append("mallory")
    got["at"] = 2
    assert (await layer.receive(second)) == nested == {"type": "terminal.watchers", "names": ["ann"], "at": 1}
    mine = await layer.receive(first)
    mine["offset"] = 99
    assert flat["offset"] == 5


async def test_the_embedded_layer_still_drops_expired_messages_and_their_channels_group_memberships():
    layer = CappedInMemoryLayer(expiry=0.05)
    layer.CLEAN_SECONDS = 0.0
    stale, other = await layer.new_channel(), await layer.new_channel()
    await layer.group_add("viewers", stale)
    await layer.send(stale, {"type": "terminal.output", "data": b"old"})
    await asyncio.sleep(0.1)
    await layer.send(other, {"type": "terminal.output", "data": b"new"})
    assert (await layer.receive(other))["data"] == b"new"  # a receive cleans: the stale message is gone
    assert stale not in layer.channels and stale not in layer.groups.get("viewers", {})
