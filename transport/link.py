"""One direct link between a web process and a worker, after its handshake (transport/links.py makes them and
says what they are for): frames both ways, queued per (channel, reply), small ones first, bulk in turns; the
handshake that proves both ends hold the worker's key; pings, and the end of a link that went quiet."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import os
import struct
import time
from collections import deque
from collections.abc import Callable

from transport import metrics

log = logging.getLogger(__name__)
# Counted for every frame: the labelled children looked up once, not a label lookup a frame.
SENT, RECEIVED = metrics.LINK_BYTES.labels("sent"), metrics.LINK_BYTES.labels("received")

MAGIC = b"TLK1"
NONCE = 16
MAC = 32
HEADER = struct.Struct(">IHH")  # payload length, channel length, reply length; then channel, reply, payload
PING = HEADER.pack(0, 0, 0)  # a frame with no channel: the other end is still there
MAX_PAYLOAD = 4 * 1024 * 1024  # over the layer's message cap (at most 16 MiB, settings): a frame this large is garbage
MAX_NAME = 1024
HANDSHAKE_SECONDS = 5.0
PING_SECONDS = 5.0
SILENT_SECONDS = 15.0  # nothing heard for this long (not even a ping): the other end is gone
SMALL_BYTES = 2048  # a message this small is interactive: it goes before bulk
QUEUE_BYTES = 8 * 1024 * 1024
WRITE_HIGH = 64 * 1024  # what the socket's buffer in this process may hold before queued frames wait
REPLY_IDLE_SECONDS = 600.0  # a viewer's channel not heard from for this long is forgotten (its socket has gone)


def link_key(secret: str, worker_id: str) -> bytes:
    """The key a worker's link is proved with: from the install's secret and the worker's id."""
    return hmac.new(secret.encode(), b"tether-link\0" + worker_id.encode(), hashlib.sha256).digest()


def _mac(key: bytes, who: bytes, first: bytes, second: bytes) -> bytes:
    return hmac.new(key, who + first + second, hashlib.sha256).digest()


class Refused(Exception):
    """The other end did not prove it holds the worker's key (or spoke no link protocol)."""


def parse_address(address: str) -> tuple[str, str | tuple[str, int]]:
    """``unix:@NAME`` (abstract) or ``unix:/PATH``, or ``tcp:HOST:PORT`` or ``tls:HOST:PORT``: (family, where)."""
    kind, _, where = address.partition(":")
    if kind == "unix" and where:
        return "unix", "\0" + where[1:] if where.startswith("@") else where
    if kind in ("tcp", "tls"):
        host, _, port = where.rpartition(":")
        if host and port.isdigit():
            return kind, (host.strip("[]"), int(port))
    raise ValueError(f"a link address is unix:@NAME, unix:/PATH, tcp:HOST:PORT or tls:HOST:PORT, not {address!r}")


class Link:
    """One connection, after its handshake: frames both ways, queued per (channel, reply), small ones first."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, side: str, peer: str):
        self.reader, self.writer, self.side, self.peer = reader, writer, side, peer
        self.queues: dict[tuple[str, str], deque[bytes]] = {}
        self.urgent: deque[tuple[str, str]] = deque()  # queues whose next frame is small, in turn
        self.bulk: deque[tuple[str, str]] = deque()  # the others, in turn
        self.queued = 0
        self.ready = asyncio.Event()
        self.room = asyncio.Event()
        self.room.set()
        self.closed = asyncio.Event()
        self.heard = time.monotonic()
        self.hold_until = 0.0  # nothing is written before this (monotonic): what went another way lands first
        # The viewers' channels on it, and when last: heard on it (the accepting end: it answers them over it),
        # or sent from (the dialling end: each is told when the link drops).
        self.replies: dict[str, float] = {}
        self.deliver: Callable[[Link, str, str, bytes], None] = lambda link, channel, reply, data: None
        self.on_close: Callable[[Link], None] = lambda link: None
        self.on_forget: Callable[[Link, str], None] = lambda link, channel: None  # a viewer's channel gone quiet
        self._tasks: list[asyncio.Task] = []
        self.counted = metrics.LINKS.labels(side)  # open links of its side (started, not yet closed)
        writer.transport.set_write_buffer_limits(high=WRITE_HIGH)

    def start(self) -> None:
        self.counted.inc()
        self._tasks = [asyncio.ensure_future(work) for work in (self._read_loop(), self._write_loop(), self._pinger())]

    @property
    def is_open(self) -> bool:
        return not self.closed.is_set()

    # --- sending ------------------------------------------------------------------------------

    async def put(self, channel: str, reply: str, data: bytes) -> bool:
        """Queue a message for ``channel``; False if the link has closed (the caller sends it another way)."""
        while self.queued > QUEUE_BYTES and self.is_open:
            self.room.clear()
            await self.room.wait()
        if not self.is_open:
            return False
        if reply and self.side == "dial":
            self.replies[reply] = time.monotonic()
        name, back = channel.encode(), reply.encode()
        frame = HEADER.pack(len(data), len(name), len(back)) + name + back + data
        key = (channel, reply)
        if (
            not self.queues
            and self.writer.transport.get_write_buffer_size() < WRITE_HIGH
            and time.monotonic() >= self.hold_until
        ):
            try:
                self._write(frame)  # nothing waits: no turn to take, no task to wake
            except (ConnectionError, OSError, RuntimeError) as error:  # (uvloop: RuntimeError on a closed handle)
                self.close(f"writing failed: {error!r}")
                return False  # nothing of it was written: the caller sends it another way
            return True
        queue = self.queues.get(key)
        if queue is None:
            queue = self.queues[key] = deque()
            (self.urgent if len(frame) <= SMALL_BYTES else self.bulk).append(key)
        queue.append(frame)
        self.queued += len(frame)
        self.ready.set()
        return True

    def _write(self, frame: bytes) -> None:
        self.writer.write(frame)
        SENT.inc(len(frame))

    def _next(self) -> bytes | None:
        turn = self.urgent or self.bulk
        if not turn:
            return None
        key = turn.popleft()
        queue = self.queues[key]
        frame = queue.popleft()
        self.queued -= len(frame)
        if queue:
            (self.urgent if len(queue[0]) <= SMALL_BYTES else self.bulk).append(key)
        else:
            del self.queues[key]
        if self.queued <= QUEUE_BYTES:
            self.room.set()
        return frame

    async def _write_loop(self) -> None:
        try:
            while True:
                if (held := self.hold_until - time.monotonic()) > 0:
                    await asyncio.sleep(held)
                frame = self._next()
                if frame is None:
                    self.ready.clear()
                    await self.ready.wait()
                    continue
                self._write(frame)
                if self.writer.transport.get_write_buffer_size() >= WRITE_HIGH:
                    await self.writer.drain()
        except (ConnectionError, OSError, RuntimeError) as error:
            self.close(f"writing failed: {error!r}")

    async def _pinger(self) -> None:
        while self.is_open:
            await asyncio.sleep(PING_SECONDS)
            if time.monotonic() - self.heard > SILENT_SECONDS:
                self.close(f"nothing heard for {SILENT_SECONDS:.0f} s")
                return
            with contextlib.suppress(ConnectionError, OSError, RuntimeError):
                self._write(PING)
            now = time.monotonic()
            for channel, at in list(self.replies.items()):
                if now - at > REPLY_IDLE_SECONDS:
                    del self.replies[channel]
                    self.on_forget(self, channel)

    # --- receiving ----------------------------------------------------------------------------

    async def _read_loop(self) -> None:
        why = "the other end closed it"
        try:
            while True:
                size, named, back = HEADER.unpack(await self.reader.readexactly(HEADER.size))
                if size > MAX_PAYLOAD or named > MAX_NAME or back > MAX_NAME:
                    why = f"a frame of {size} bytes for a name of {named}: not the link protocol"
                    break
                body = await self.reader.readexactly(named + back + size) if named + back + size else b""
                self.heard = time.monotonic()
                RECEIVED.inc(HEADER.size + len(body))
                if not named:
                    continue  # a ping
                channel = body[:named].decode(errors="replace")
                reply = body[named : named + back].decode(errors="replace")
                self.deliver(self, channel, reply, body[named + back :])
        except asyncio.IncompleteReadError:
            pass
        except (ConnectionError, OSError) as error:
            why = f"reading failed: {error!r}"
        self.close(why)

    # --- the end --------------------------------------------------------------------------------

    def close(self, why: str) -> None:
        if not self.is_open:
            return
        self.closed.set()
        self.room.set()
        self.counted.dec()
        log.info("link %s %s closed: %s", self.side, self.peer, why)
        with contextlib.suppress(Exception):
            self.writer.close()
        current = asyncio.current_task()
        for task in self._tasks:
            if task is not current:
                task.cancel()
        self.queues.clear()
        self.urgent.clear()
        self.bulk.clear()
        self.queued = 0
        self.on_close(self)


async def handshake_accept(reader, writer, key: bytes) -> None:
    mine = os.urandom(NONCE)
    writer.write(MAGIC + mine)
    theirs = await reader.readexactly(NONCE)
    proof = await reader.readexactly(MAC)
    if not hmac.compare_digest(proof, _mac(key, b"dial", mine, theirs)):
        raise Refused("the dialing end does not hold this worker's key")
    writer.write(_mac(key, b"accept", theirs, mine))
    await writer.drain()


async def handshake_dial(reader, writer, key: bytes) -> None:
    if await reader.readexactly(len(MAGIC)) != MAGIC:
        raise Refused("the other end speaks no link protocol")
    theirs = await reader.readexactly(NONCE)
    mine = os.urandom(NONCE)
    writer.write(mine + _mac(key, b"dial", theirs, mine))
    await writer.drain()
    if not hmac.compare_digest(await reader.readexactly(MAC), _mac(key, b"accept", mine, theirs)):
        raise Refused("the worker at this address does not hold its key (another process listens there)")
