"""The two Redis connections under Tether's pub/sub layer (transport/redis_layer.py says why they are its own):
a publisher that pipelines PUBLISH with Redis's answers off (one a second still answered), and a subscriber
that re-subscribes everything after Redis comes back, each written as RESP and read with hiredis."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import hiredis
from redis.asyncio.connection import ConnectionPool
from redis.exceptions import RedisError

log = logging.getLogger(__name__)

WRITE_BUFFER_HIGH = 4 * 1024 * 1024  # past this much unsent, a publish waits for the socket to drain
CONFIRM_SECONDS = 5.0  # how long a subscribe waits for Redis to confirm it
CONNECT_SECONDS = 5.0
ANSWER_SECONDS = 10.0  # an answer owed this long: the connection is taken for dead
CLOSE_SECONDS = 5.0  # what is still buffered gets this long to reach Redis when the layer closes
PROBE_SECONDS = 1.0  # while publishing with Redis's answers off, one publish this often is answered
REPLIES_OFF = b"*3\r\n$6\r\nCLIENT\r\n$5\r\nREPLY\r\n$3\r\nOFF\r\n"
REPLIES_ON = b"*3\r\n$6\r\nCLIENT\r\n$5\r\nREPLY\r\n$2\r\nON\r\n"
PING = b"*1\r\n$4\r\nPING\r\n"


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


async def _closed(writer: asyncio.StreamWriter) -> None:
    """Close ``writer`` once what it has buffered is sent (asyncio's close flushes first), and wait for that."""
    writer.close()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(writer.wait_closed(), CLOSE_SECONDS)


async def _replies_off(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
    """Ask Redis not to answer this connection's commands; True if it agreed. ``OFF`` is never answered
    when it works, so ``ON`` and a ``PING`` follow it: ON's ``+OK`` then PING's answer (``+PONG``, or an
    error where an ACL refuses PING) mean OFF took, and replies are turned off again. An error first (an
    ACL without ``CLIENT``, a proxy) or a second ``+OK`` (something that answered OFF) means it did not
    take as Redis's does: every command stays answered."""
    writer.write(REPLIES_OFF + REPLIES_ON + PING)
    parser, replies = hiredis.Reader(), []

    def took() -> bool:  # of the first two answers: ON's +OK, then PING's (never +OK)
        return not isinstance(replies[0], hiredis.ReplyError) and replies[1] != b"OK"

    async with asyncio.timeout(CONNECT_SECONDS):
        while len(replies) < 2 or (len(replies) < 3 and not took()):  # OFF answered: three answers
            if not (data := await reader.read(4096)):
                raise ConnectionError("Redis closed the connection")
            parser.feed(data)
            while (reply := parser.gets()) is not False:
                replies.append(reply)
    if not took():
        log.info("Redis did not take CLIENT REPLY OFF (%s): every publish stays answered", replies[0])
        return False
    writer.write(REPLIES_OFF)
    return True


class Publisher:
    """One connection that publishes without waiting for an answer. Redis answers one publish a second
    (or every one, where it refused ``CLIENT REPLY OFF``), and the answers are counted: one owed for
    ANSWER_SECONDS means a dead connection (a Redis host gone without a reset), which is then dropped so
    the next publish raises instead of piling up behind it."""

    def __init__(self, url: str):
        self.url = url
        self.writer: asyncio.StreamWriter | None = None
        self.replies: asyncio.Task | None = None
        self.connecting = asyncio.Lock()
        self.sent = self.answered = 0  # answers asked for, and received
        self.quiet = False  # Redis answers only the publishes sent between REPLIES_ON and REPLIES_OFF
        self.probed = 0.0  # when an answer was last asked for
        self.waiting_since = 0.0  # when the oldest owed answer was asked for (or the last answer came)

    async def publish(self, channel: str, data: bytes) -> None:
        writer = self.writer
        if writer is None or writer.transport.is_closing():
            writer = await self._connect()
        now = time.monotonic()
        if self.sent == self.answered:
            self.waiting_since = now
        elif now - self.waiting_since > ANSWER_SECONDS:
            writer.transport.abort()
            raise ConnectionError(f"Redis has not answered a publish in {ANSWER_SECONDS:.0f} s")
        command = _command(b"PUBLISH", channel, data)
        if not self.quiet:
            writer.write(command)
            self.sent += 1
        elif now - self.probed >= PROBE_SECONDS:  # answered: ON's +OK and the publish's count
            writer.write(REPLIES_ON + command + REPLIES_OFF)
            self.sent += 2
            self.probed = now
        else:
            writer.write(command)
        if writer.transport.get_write_buffer_size() > WRITE_BUFFER_HIGH:
            await writer.drain()

    async def _connect(self) -> asyncio.StreamWriter:
        async with self.connecting:
            if self.writer is not None and not self.writer.transport.is_closing():
                return self.writer
            await self.close()
            reader, writer = await _connect(self.url)
            try:
                quiet = await _replies_off(reader, writer)
            except BaseException as error:  # a cancelled connect leaves no socket behind either
                writer.transport.abort()
                if isinstance(error, (TimeoutError, OSError, hiredis.ProtocolError)):
                    raise ConnectionError(f"Redis did not answer CLIENT REPLY: {error!r}") from error
                raise
            self.writer, self.sent, self.answered, self.quiet, self.probed = writer, 0, 0, quiet, 0.0
            self.replies = asyncio.ensure_future(self._read_replies(reader, writer))
            return writer

    async def _read_replies(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Count Redis's answers (to every publish, or to the probes where it agreed to answer only those);
        an error (a missing permission) is logged as one: the publish it answers has already returned."""
        parser = hiredis.Reader()
        try:
            while data := await reader.read(65536):
                parser.feed(data)
                while (reply := parser.gets()) is not False:
                    if writer is self.writer:
                        self.answered += 1
                        self.waiting_since = time.monotonic()
                    if isinstance(reply, hiredis.ReplyError):
                        log.error("Redis refused a publish: %s", reply)
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    async def close(self) -> None:
        writer, self.writer = self.writer, None
        if self.replies is not None:
            self.replies.cancel()
            with contextlib.suppress(BaseException):
                await self.replies
            self.replies = None
        if writer is not None:
            await _closed(writer)


class Subscriber:
    """One connection that holds every subscription of this event loop and hands messages on.

    A SUBSCRIBE is confirmed by Redis's reply; replies are counted per name, so a confirmation is
    given only once every SUBSCRIBE sent for that name has been answered."""

    def __init__(self, url: str, deliver):
        self.url, self.deliver = url, deliver
        self.names: set[str] = set()  # what should be subscribed
        self.writer: asyncio.StreamWriter | None = None
        self.ready = asyncio.Event()  # connected and every name in ``names`` asked for
        self.confirming: dict[str, list[asyncio.Future]] = {}  # callers waiting for a name's confirmation
        self.unanswered: dict[str, int] = {}  # SUBSCRIBEs sent on this connection and not yet answered
        self.task: asyncio.Task | None = None
        self.failure: Exception | None = None  # why the last connect failed, said to a subscribe that gives up

    def _ask(self, *names: str) -> None:
        self.writer.write(_command(b"SUBSCRIBE", *names))
        for name in names:
            self.unanswered[name] = self.unanswered.get(name, 0) + 1

    async def subscribe(self, name: str) -> None:
        """Return once Redis has confirmed ``name`` (at once if it already had); raise ConnectionError if it
        does not within CONFIRM_SECONDS."""
        if name in self.names and name not in self.confirming:
            return
        confirmed = asyncio.get_running_loop().create_future()
        self.confirming.setdefault(name, []).append(confirmed)
        if name not in self.names:
            self.names.add(name)
            self._start()
            if self.ready.is_set():  # otherwise the connect subscribes it with the rest
                self._ask(name)
        try:
            async with asyncio.timeout(CONFIRM_SECONDS):
                await confirmed
        except BaseException as error:
            # Redis away or too slow (the caller fails now, as a publish would, rather than listen on a
            # channel nothing may reach), or the caller cancelled. The caller lets go of what only it
            # needed (_LoopLayer.release).
            waiting = self.confirming.get(name, [])
            if confirmed in waiting:
                waiting.remove(confirmed)
            if not waiting:
                self.confirming.pop(name, None)
            if isinstance(error, TimeoutError):
                why = f": {self.failure}" if self.failure else ""
                raise ConnectionError(
                    f"Redis did not confirm the subscription to {name} in {CONFIRM_SECONDS:.0f} s{why}"
                ) from None
            raise

    def unsubscribe(self, name: str) -> None:
        """Stop listening on ``name`` (no await: it completes even in a task being cancelled)."""
        if name not in self.names or name in self.confirming:
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
                self.failure = error
                log.warning("cannot subscribe on Redis (%r); trying again in %.1fs", error, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            backoff, self.failure = 0.1, None
            self.writer, self.unanswered = writer, {}
            if self.names:
                self._ask(*sorted(self.names))
            self.ready.set()
            try:
                await self._read(reader)
            except Exception as error:  # the connection, or a reply hiredis could not parse: start afresh
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
                        log.error("Redis refused a subscription command: %s", reply)
                    continue
                kind = reply[0]
                if kind == b"message":
                    self.deliver(reply[1].decode(), reply[2])
                elif kind == b"subscribe":
                    self._answered(reply[1].decode())
        log.warning("Redis closed the subscribing connection; subscribing again")

    def _answered(self, name: str) -> None:
        left = self.unanswered.get(name, 1) - 1
        if left > 0:  # an earlier SUBSCRIBE's answer: the latest is still on its way
            self.unanswered[name] = left
            return
        self.unanswered.pop(name, None)
        if name not in self.names:
            return
        for future in self.confirming.pop(name, ()):
            if not future.done():
                future.set_result(None)

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
