"""Tether's pub/sub channel layer: Redis PUBLISH and SUBSCRIBE spoken directly, on one connection each.

channels-redis's pub/sub layer carries each message through redis-py's full command path: a lock and a
pool checkout per publish, a wait for Redis's reply before the next, and on the receiving side a
``get_message`` poll with its own timeout scope for every message. Measured on this machine
(docs/benchmarks.md), that costs about 150 µs of the two processes' CPU per hop; the same hop written as
RESP and read with hiredis costs about 60 µs. Every keystroke and every piece of output crosses two hops.

The semantics are the same as channels-redis's pub/sub layer (the one the suite proved the protocol on):
at most once, nothing kept for a channel nobody listens to. Publishes are pipelined (Redis's replies are
read and counted, not waited for); a publish on a lost connection raises, as before, and the next one
connects again. The subscribing connection re-subscribes everything after Redis comes back. A new
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

import hiredis
import msgpack
from channels.layers import BaseChannelLayer
from redis.asyncio.connection import ConnectionPool
from redis.exceptions import RedisError

log = logging.getLogger(__name__)

WRITE_BUFFER_HIGH = 4 * 1024 * 1024  # past this much unsent, a publish waits for the socket to drain
CONFIRM_SECONDS = 5.0  # how long a subscribe waits for Redis to confirm it
CONNECT_SECONDS = 5.0


def _command(*parts: bytes | str) -> bytes:
    out = [b"*%d\r\n" % len(parts)]
    for part in parts:
        if isinstance(part, str):
            part = part.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(part), part))
    return b"".join(out)


async def _connect(url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection made (and authenticated) by redis-py, whose streams are then taken over: redis-py's
    connection object forgets them, so it neither reads them nor closes them when it is collected."""
    connection = ConnectionPool.from_url(url, protocol=2, socket_connect_timeout=CONNECT_SECONDS).make_connection()
    try:
        await connection.connect()
    except RedisError as error:  # one kind of error for callers: Python's own (the message names no password)
        raise ConnectionError(str(error)) from error
    reader, writer = connection._reader, connection._writer
    connection._reader = connection._writer = None
    return reader, writer


class _Publisher:
    """One connection that publishes without waiting for each reply."""

    def __init__(self, url: str):
        self.url = url
        self.writer: asyncio.StreamWriter | None = None
        self.replies: asyncio.Task | None = None
        self.connecting = asyncio.Lock()

    async def publish(self, channel: str, data: bytes) -> None:
        writer = self.writer
        if writer is None or writer.transport.is_closing():
            writer = await self._connect()
        writer.write(_command(b"PUBLISH", channel, data))
        if writer.transport.get_write_buffer_size() > WRITE_BUFFER_HIGH:
            await writer.drain()

    async def _connect(self) -> asyncio.StreamWriter:
        async with self.connecting:
            if self.writer is not None and not self.writer.transport.is_closing():
                return self.writer
            await self.close()
            reader, writer = await _connect(self.url)
            self.writer = writer
            self.replies = asyncio.ensure_future(self._read_replies(reader, writer))
            return writer

    async def _read_replies(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Read (and drop) the subscriber counts Redis answers each PUBLISH with; an error is logged."""
        parser = hiredis.Reader()
        try:
            while data := await reader.read(65536):
                parser.feed(data)
                while (reply := parser.gets()) is not False:
                    if isinstance(reply, hiredis.ReplyError):
                        log.warning("Redis refused a publish: %s", reply)
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    async def close(self) -> None:
        if self.replies is not None:
            self.replies.cancel()
            with contextlib.suppress(BaseException):
                await self.replies
            self.replies = None
        if self.writer is not None:
            self.writer.close()
            self.writer = None


class _Subscriber:
    """One connection that holds every subscription of this event loop and hands messages to queues."""

    def __init__(self, url: str, deliver):
        self.url, self.deliver = url, deliver
        self.names: set[str] = set()  # what should be subscribed
        self.writer: asyncio.StreamWriter | None = None
        self.ready = asyncio.Event()  # connected and every name in ``names`` asked for
        self.confirming: dict[str, list[asyncio.Future]] = {}
        self.task: asyncio.Task | None = None

    async def subscribe(self, name: str) -> None:
        if name in self.names:
            return
        self.names.add(name)
        confirmed = asyncio.get_running_loop().create_future()
        self.confirming.setdefault(name, []).append(confirmed)
        self._start()
        if self.ready.is_set():  # otherwise the connect subscribes it with the rest
            self.writer.write(_command(b"SUBSCRIBE", name))
        try:
            async with asyncio.timeout(CONFIRM_SECONDS):
                await confirmed
        except TimeoutError:
            # Redis away (or too slow to be of use): the caller fails now, as a publish would, rather
            # than listen on a channel nothing may reach.
            waiting = self.confirming.get(name, [])
            if confirmed in waiting:
                waiting.remove(confirmed)
            if not waiting:
                self.confirming.pop(name, None)
            await self.unsubscribe(name)
            raise ConnectionError(
                f"Redis did not confirm the subscription to {name} in {CONFIRM_SECONDS:.0f} s"
            ) from None

    async def unsubscribe(self, name: str) -> None:
        if name not in self.names:
            return
        self.names.discard(name)
        if self.ready.is_set() and not self.writer.transport.is_closing():
            self.writer.write(_command(b"UNSUBSCRIBE", name))

    def _start(self) -> None:
        if self.task is None or self.task.done():
            self.task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        backoff = 0.1
        while self.names or self.confirming:
            try:
                reader, writer = await _connect(self.url)
            except Exception as error:  # refused, unreachable, or redis-py's own (AUTH refused, its timeout)
                log.warning("cannot subscribe on Redis (%r); trying again in %.1fs", error, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            backoff = 0.1
            self.writer = writer
            if self.names:
                writer.write(_command(b"SUBSCRIBE", *sorted(self.names)))
            self.ready.set()
            try:
                await self._read(reader)
            except (ConnectionError, OSError) as error:
                log.warning("the subscribing connection to Redis failed (%r); subscribing again", error)
            finally:
                self.ready.clear()
                writer.close()
                self.writer = None

    async def _read(self, reader: asyncio.StreamReader) -> None:
        parser = hiredis.Reader()
        while data := await reader.read(262144):
            parser.feed(data)
            while (reply := parser.gets()) is not False:
                if not isinstance(reply, list) or len(reply) < 3:
                    if isinstance(reply, hiredis.ReplyError):
                        log.warning("Redis refused a subscription command: %s", reply)
                    continue
                kind = reply[0]
                if kind == b"message":
                    self.deliver(reply[1].decode(), reply[2])
                elif kind == b"subscribe":
                    for future in self.confirming.pop(reply[1].decode(), ()):
                        if not future.done():
                            future.set_result(None)
        log.warning("Redis closed the subscribing connection; subscribing again")

    async def close(self) -> None:
        self.names.clear()
        for futures in self.confirming.values():
            for future in futures:
                future.cancel()
        self.confirming.clear()
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(BaseException):
                await self.task
            self.task = None
        if self.writer is not None:
            self.writer.close()
            self.writer = None


class _LoopLayer:
    """The layer's connections and queues for one event loop (asyncio objects belong to one loop)."""

    def __init__(self, url: str):
        self.channels: dict[str, asyncio.Queue] = {}
        self.groups: dict[str, set[str]] = {}  # a group's Redis channel -> the channels of ours in it
        self.publisher = _Publisher(url)
        self.subscriber = _Subscriber(url, self._deliver)

    def _deliver(self, name: str, data: bytes) -> None:
        if (queue := self.channels.get(name)) is not None:
            queue.put_nowait(data)
        for channel in self.groups.get(name, ()):
            if (queue := self.channels.get(channel)) is not None:
                queue.put_nowait(data)

    async def forget(self, channel: str) -> None:
        if self.channels.pop(channel, None) is not None:
            await self.subscriber.unsubscribe(channel)

    async def close(self) -> None:
        await self.publisher.close()
        await self.subscriber.close()
        self.channels.clear()
        self.groups.clear()


class RedisPubSubLayer(BaseChannelLayer):
    """The channel layer API (with groups and flush) over Redis pub/sub; ``hosts`` as channels-redis takes
    them (one host: pub/sub is not sharded here)."""

    extensions = ["groups", "flush"]

    def __init__(self, hosts=None, prefix: str = "asgi", expiry=60, capacity=100, channel_capacity=None, **kwargs):
        super().__init__(expiry=expiry, capacity=capacity, channel_capacity=channel_capacity)
        host = (hosts or ["redis://localhost:6379"])[0]
        self.url = host["address"] if isinstance(host, dict) else host
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
            with contextlib.suppress(Exception):
                await layer.forget(channel)
            raise
        return self.deserialize(data)

    async def forget(self, channel: str) -> None:
        """Stop listening on ``channel`` (a consumer that has ended: terminals.layers.forget_channel)."""
        await self._layer().forget(channel)

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
            await layer.subscriber.unsubscribe(name)

    async def group_send(self, group: str, message: dict) -> None:
        await self._layer().publisher.publish(self._group(group), self.serialize(message))

    async def flush(self) -> None:
        layer = self._layers.pop(asyncio.get_running_loop(), None)
        if layer is not None:
            await layer.close()
