"""Tether's pub/sub channel layer: Redis PUBLISH and SUBSCRIBE spoken directly, on one connection each.

channels-redis's pub/sub layer carries each message through redis-py's full command path: a lock and a
pool checkout per publish, a wait for Redis's reply before the next, and on the receiving side a
``get_message`` poll with its own timeout scope for every message. Measured on this machine
(docs/benchmarks.md), that costs about 150 µs of the two processes' CPU per hop; the same hop written as
RESP and read with hiredis costs about 60 µs. Every keystroke and every piece of output crosses two hops.

The semantics are the same as channels-redis's pub/sub layer (the one the suite proved the protocol on):
at most once, nothing kept for a channel nobody listens to. Publishes are pipelined, and Redis is asked
not to answer them (``CLIENT REPLY OFF``): reading an answer woke the publisher once more per keystroke,
10% of a keystroke's CPU on the three processes (docs/benchmarks.md). One publish a second (PROBE_SECONDS)
while publishing is still answered, so a dead connection is still found: a publish on a connection known
lost (or whose answer is owed for ANSWER_SECONDS) raises, and the next one connects again. Redis sends no
error to a connection it does not answer either: a refused publish (a missing ACL permission) is logged
when it is an answered one, so a refusal that lasts shows within a second of publishing, a lone one may
not. A Redis, an ACL or a proxy that does not take ``CLIENT REPLY OFF`` answers every publish, as
before, and the answers are counted the same way. What is still buffered when the layer closes gets
CLOSE_SECONDS to reach Redis. The subscribing connection re-subscribes everything after Redis comes back. A new
channel is returned only once Redis has confirmed the subscription, so the first message sent to it
after ``new_channel`` is never lost to a race.

redis-py still makes each connection (the URL, TLS, a unix socket, AUTH), so everything ``REDIS_URL``
accepts works here the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import types
import uuid

import msgpack
from channels.layers import BaseChannelLayer

from transport.redis_wire import Publisher, Subscriber

log = logging.getLogger(__name__)


class _LoopLayer:
    """The layer's connections and queues for one event loop (asyncio objects belong to one loop)."""

    def __init__(self, url: str):
        self.channels: dict[str, asyncio.Queue] = {}
        self.groups: dict[str, set[str]] = {}  # a group's Redis channel -> the channels of ours in it
        self.publisher = Publisher(url)
        self.subscriber = Subscriber(url, self._deliver)
        self.links = None  # direct links to or from workers (transport/links.py), where the layer makes them

    def _deliver(self, name: str, data: bytes) -> None:
        if (queue := self.channels.get(name)) is not None:
            queue.put_nowait(data)
        for channel in self.groups.get(name, ()):
            if (queue := self.channels.get(channel)) is not None:
                queue.put_nowait(data)

    def release(self, name: str) -> None:
        """Unsubscribe ``name`` unless a channel's queue or a group's member of ours still needs it (or
        another caller still waits for its confirmation)."""
        if name not in self.channels and not self.groups.get(name):
            self.subscriber.unsubscribe(name)

    def forget(self, channel: str) -> None:
        """The channel's consumer has ended: its queue, its subscription and its groups' go (the groups'
        only when no other channel of ours is in them)."""
        if self.channels.pop(channel, None) is not None:
            self.subscriber.unsubscribe(channel)
        for name, members in list(self.groups.items()):
            if channel in members:
                members.discard(channel)
                if not members:
                    del self.groups[name]
                    self.subscriber.unsubscribe(name)

    async def close(self) -> None:
        if self.links is not None:
            await self.links.close()
        await self.publisher.close()
        await self.subscriber.close()
        self.channels.clear()
        self.groups.clear()


class RedisPubSubLayer(BaseChannelLayer):
    """The channel layer API (with groups and flush) over Redis pub/sub; ``hosts`` as channels-redis takes
    them (one host: pub/sub is not sharded here)."""

    extensions = ["groups", "flush"]

    def __init__(self, hosts=None, prefix: str = "asgi", expiry=60, capacity=100, channel_capacity=None, **options):
        super().__init__(expiry=expiry, capacity=capacity, channel_capacity=channel_capacity)
        # What channels-redis would honour and this layer would not is refused, never silently dropped
        # (messages in plaintext where encryption was asked for, a second shard never used).
        if options:
            raise ValueError(f"RedisPubSubLayer does not take {', '.join(sorted(options))}")
        hosts = hosts or ["redis://localhost:6379"]
        if len(hosts) != 1:
            raise ValueError("RedisPubSubLayer takes one host (pub/sub is not sharded here)")
        host = hosts[0]
        if isinstance(host, dict):
            if set(host) != {"address"}:
                raise ValueError(
                    f"RedisPubSubLayer takes a host as its URL only, not {sorted(set(host) - {'address'})}"
                )
            host = host["address"]
        if not isinstance(host, str):
            raise ValueError(f"RedisPubSubLayer takes a host as a redis://, rediss:// or unix:// URL, not {host!r}")
        self.url = host
        self.prefix = prefix
        self._layers: dict[asyncio.AbstractEventLoop, _LoopLayer] = {}

    def _layer(self) -> _LoopLayer:
        loop = asyncio.get_running_loop()
        layer = self._layers.get(loop)
        if layer is None:
            layer = self._layers[loop] = _LoopLayer(self.url)
            self._close_with(loop)
        return layer

    def _close_with(self, loop: asyncio.AbstractEventLoop) -> None:
        """A loop made for one call (async_to_sync from a thread) closes its connections as it closes."""
        original = loop.close

        def close(this, *args, **kwargs):
            layer = self._layers.pop(loop, None)
            if layer is not None and not loop.is_running():
                with contextlib.suppress(Exception):
                    loop.run_until_complete(layer.close())
            this.close = original
            return original(*args, **kwargs)

        loop.close = types.MethodType(close, loop)

    # --- messages ---------------------------------------------------------------------------

    def serialize(self, message: dict) -> bytes:
        return msgpack.packb(message)

    def deserialize(self, data: bytes) -> dict:
        return msgpack.unpackb(data)

    async def send(self, channel: str, message: dict) -> None:
        await self._layer().publisher.publish(channel, self.serialize(message))

    async def new_channel(self, prefix: str = "specific.") -> str:
        channel = f"{self.prefix}{prefix}{uuid.uuid4().hex}"
        await self._subscribe(channel)
        return channel

    async def _subscribe(self, channel: str) -> asyncio.Queue:
        layer = self._layer()
        queue = layer.channels.get(channel)
        if queue is None:
            queue = layer.channels[channel] = asyncio.Queue()
            try:
                await layer.subscriber.subscribe(channel)
            except BaseException:
                layer.channels.pop(channel, None)
                layer.release(channel)
                raise
        return queue

    async def receive(self, channel: str) -> dict:
        layer = self._layer()
        queue = layer.channels.get(channel)
        if queue is None:
            queue = await self._subscribe(channel)
        try:
            data = await queue.get()
        except (asyncio.CancelledError, TimeoutError, GeneratorExit):
            # As channels-redis does: a cancelled receive is its consumer ending (channels has no call
            # for that), so the channel is let go of here.
            layer.forget(channel)
            raise
        return self.deserialize(data)

    async def forget(self, channel: str) -> None:
        """Stop listening on ``channel`` (a consumer that has ended: transport.layers.forget_channel)."""
        self._layer().forget(channel)

    # --- groups -------------------------------------------------------------------------------

    def _group(self, group: str) -> str:
        return f"{self.prefix}__group__{group}"

    async def group_add(self, group: str, channel: str) -> None:
        layer = self._layer()
        if channel not in layer.channels:
            raise RuntimeError("group_add() takes a channel of this process (self.channel_name)")
        name = self._group(group)
        members = layer.groups.setdefault(name, set())
        members.add(channel)
        try:
            await layer.subscriber.subscribe(name)
        except BaseException:
            members.discard(channel)
            if not members:
                layer.groups.pop(name, None)
            layer.release(name)
            raise

    async def group_discard(self, group: str, channel: str) -> None:
        layer = self._layer()
        name = self._group(group)
        members = layer.groups.get(name)
        if not members or channel not in members:
            return
        members.discard(channel)
        if not members:
            del layer.groups[name]
            layer.subscriber.unsubscribe(name)

    async def group_send(self, group: str, message: dict) -> None:
        await self._layer().publisher.publish(self._group(group), self.serialize(message))

    async def flush(self) -> None:
        layer = self._layers.pop(asyncio.get_running_loop(), None)
        if layer is not None:
            await layer.close()
