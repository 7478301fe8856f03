"""What Tether needs from a channel layer that the layers do not offer themselves."""

from __future__ import annotations

import asyncio
import logging
import time

import msgpack
from channels.exceptions import ChannelFull
from channels.layers import InMemoryChannelLayer
from channels_redis.core import RedisChannelLayer
from channels_redis.pubsub import RedisPubSubChannelLayer
from django.conf import settings

from transport import metrics
from transport.link import link_key
from transport.link_tls import LinkTls
from transport.links import Links
from transport.redis_layer import RedisPubSubLayer

log = logging.getLogger(__name__)


class MessageTooLarge(ValueError):
    """A channel-layer message over TETHER_LAYER_MESSAGE_BYTES: refused before it reaches Redis."""


def _checked(size: int, message: dict) -> None:
    cap = settings.TETHER_LAYER_MESSAGE_BYTES
    if size > cap:
        raise MessageTooLarge(f"{message.get('type', 'a message')} of {size} bytes is over the {cap}-byte message cap")


class _CappedSerialize:
    """Both Redis layers serialise every message they send through ``serialize``: the cap is taken there."""

    def serialize(self, message):
        data = super().serialize(message)
        _checked(len(data), message)
        return data


# What a consumer whose messages went over a direct link is told when it drops (its handler: ``link_lost``).
LINK_LOST = "link.lost"


class CappedRedisPubSubLayer(_CappedSerialize, RedisPubSubLayer):
    """Tether's pub/sub layer (the default), refusing any message over the cap; with ``links`` (the default),
    a worker's stream goes over a direct link to it where one can be made (transport/links.py)."""

    def __init__(self, *args, links: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.links_on = links

    def links(self) -> Links:
        """This event loop's links, kept with its connections (made on first use; closed in ``flush``)."""
        layer = self._layer()
        if layer.links is None:

            def deliver(channel: str, data: bytes) -> None:
                if (queue := layer.channels.get(channel)) is not None:
                    queue.put_nowait(data)

            lost = self.serialize({"type": LINK_LOST})
            layer.links = Links(
                deliver,
                lambda worker_id: link_key(settings.SECRET_KEY, worker_id),
                lambda channel: deliver(channel, lost),
                LinkTls.of(settings.TETHER_LINK_TLS_CERT, settings.TETHER_LINK_TLS_KEY, settings.TETHER_LINK_TLS_CA),
            )
        return layer.links

    async def listen(self, worker_id: str) -> str:
        """A worker's links: listen as TETHER_LINK_LISTEN says; the address to advertise ("" when links are off)."""
        if not self.links_on:
            return ""
        return await self.links().listen(worker_id, settings.TETHER_LINK_LISTEN, settings.TETHER_LINK_ADVERTISE)

    def route(self, channel: str, address: str, worker_id: str) -> None:
        """Messages to ``channel`` go over the link ``worker_id`` advertised at ``address`` (when links are on)."""
        if self.links_on and address:
            self.links().route(channel, address, worker_id)

    async def send(self, channel: str, message: dict) -> None:
        data = self.serialize(message)
        layer = self._layer()
        if layer.links is not None:  # only a loop that listened or was given a route has any
            reply = message.get("reply")
            if await layer.links.send(channel, reply if isinstance(reply, str) else "", data):
                return
        await layer.publisher.publish(channel, data)


class CappedPubSubLayer(_CappedSerialize, RedisPubSubChannelLayer):
    """channels-redis's pub/sub layer, refusing any message over the cap."""


class CappedRedisLayer(_CappedSerialize, RedisChannelLayer):
    """The core (list-based) Redis layer, refusing any message over the cap."""


class CappedInMemoryLayer(InMemoryChannelLayer):
    """The embedded mode's layer: nothing is serialised, so the cap is taken on the msgpack size the
    Redis layers would send, and the embedded mode refuses what production would.

    channels' in-memory layer deep-copies every message and walks every channel and group for expired
    ones at each receive; here a flat message (only strings, bytes and numbers: all of Tether's on the hot
    path) is copied as a dict, which is all a deep copy of it does, the walk runs at most once a second, and
    a message is packed only when a bound on its size could pass the cap."""

    CLEAN_SECONDS = 1.0
    _cleaned = 0.0

    async def send(self, channel, message):
        if _capped(message) == NOT_FLAT:
            return await super().send(channel, message)
        self.require_valid_channel_name(channel)
        assert "__asgi_channel__" not in message
        queue = self.channels.setdefault(channel, asyncio.Queue(maxsize=self.get_capacity(channel)))
        try:
            queue.put_nowait((time.time() + self.expiry, dict(message)))
        except asyncio.QueueFull:
            raise ChannelFull(channel) from None

    async def group_send(self, group, message):
        _capped(message)  # refused once, members or none (channels' then sends to each through send())
        return await super().group_send(group, message)

    def _clean_expired(self):
        now = time.monotonic()
        if now - self._cleaned >= self.CLEAN_SECONDS:
            self._cleaned = now
            super()._clean_expired()


_SCALARS = (str, bytes, int, float, bool, type(None))
NOT_FLAT = -1


def _capped(message) -> int:
    """Refuse ``message`` if it is over the cap, packing it only when its size bound could be; returns the
    bound."""
    bound = _size_bound(message) if isinstance(message, dict) else NOT_FLAT
    if bound == NOT_FLAT or bound > settings.TETHER_LAYER_MESSAGE_BYTES:
        _checked(len(msgpack.packb(message)), message)
    return bound


def _size_bound(message: dict) -> int:
    """At least the message's msgpack size, cheaply: a flat message's strings, bytes and numbers, each with
    the most msgpack adds to one (9 bytes); ``NOT_FLAT`` for a message holding anything else."""
    size = 5
    for key, value in message.items():
        if type(value) not in _SCALARS or type(key) is not str:
            return NOT_FLAT
        size += len(key) + 9
        if type(value) in (str, bytes):
            size += len(value) * (4 if type(value) is str else 1) + 9  # UTF-8: at most 4 bytes a character
        else:
            size += 9
    return size


def tell_group(group: str, message: dict, what: str) -> None:
    """From synchronous code (after a commit): a message to every socket in ``group``. Redis away is logged,
    not raised: each socket's own periodic check finds out what the message would have told it."""
    from asgiref.sync import async_to_sync
    from channels.layers import get_channel_layer

    try:
        async_to_sync(get_channel_layer().group_send)(group, message)
    except Exception as error:
        log.warning("could not tell %s: %r", what, error)
        metrics.LAYER_ERRORS.labels("group_send").inc()


async def forget_channel(layer, channel: str | None) -> None:
    """Let go of a consumer's own channel once the consumer has ended.

    Channels has no call for this: each layer cleans up when a pending ``receive`` is cancelled.
    But channels' dispatch loop (``await_many_dispatch``) only cancels, on the way out, the receives
    still pending. A receive that had already returned a message, because output for the viewer
    arrived in the same moment the socket closed, is never cancelled, so the pub/sub layer stayed
    subscribed to the channel for the life of daphne, and kept queueing what was sent to it. That
    happened to nearly every viewer that left while its terminal printed (tests/bridge, churn
    benchmark). The core and in-memory layers kept the channel's unread messages the same way.
    """
    if layer is None or not channel:
        return
    if isinstance(layer, RedisPubSubLayer):
        try:
            await layer.forget(channel)
        except Exception as error:  # Redis away: the subscription goes with the connection's next loss
            log.warning("could not unsubscribe %s (%r)", channel, error)
    elif isinstance(layer, RedisPubSubChannelLayer):
        loop_layer = layer._get_layer()  # the layer object of this event loop
        if loop_layer.channels.pop(channel, None) is not None:
            try:
                await loop_layer._get_shard(channel).unsubscribe(channel)
            except Exception as error:  # Redis away: the socket is closing anyway; say what is left behind
                log.warning("could not unsubscribe %s (%r): it stays subscribed until daphne restarts", channel, error)
    elif isinstance(layer, RedisChannelLayer):
        layer.receive_buffer.pop(channel, None)
    elif isinstance(layer, InMemoryChannelLayer):
        layer.channels.pop(channel, None)


async def keep_receiving(layer) -> None:
    """Keep one standing subscription in this process, so the pub/sub layer's reader never idles.

    channels-redis's pub/sub reader polls Redis only while the process is subscribed to something:
    with no subscription it sleeps 0.1 s a round. A daphne whose last viewer had just left (a
    reload, a reconnect) therefore held the next viewer's first messages for up to 100 ms: the
    reconnect benchmark's p95 went from 10 to 98 ms once viewers stopped leaking their channels.
    One channel nothing is sent to, subscribed once per event loop, keeps the reader reading.
    """
    if not isinstance(layer, RedisPubSubChannelLayer):
        return
    loop_layer = layer._get_layer()
    if getattr(loop_layer, "tether_standing", None):
        return
    loop_layer.tether_standing = "subscribing"  # a second connect meanwhile does not subscribe again
    try:
        loop_layer.tether_standing = await loop_layer.new_channel("tether.standing.")
    except BaseException:
        loop_layer.tether_standing = None  # Redis away: the next connect tries again
        raise
