"""Outages between the browser and the process: Redis and daphne restarting mid-output."""

from __future__ import annotations

import asyncio
import time

import pytest
from asgiref.sync import sync_to_async
from websockets.exceptions import ConnectionClosed, WebSocketException

from tests.bridge.harness import RedisServer, Stack, Viewer, metric, without_marks

pytestmark = [pytest.mark.continuity, pytest.mark.django_db(transaction=True)]

COUNT = 400_000
COMMAND = f"seq 1 {COUNT}; printf '%s\\n' '!DONE!'\r"


class Reader:
    """Reads a session like the page does: on a dropped socket it reconnects and resumes from its cursor."""

    def __init__(self, ports: list[int], session_id, cookie: str):
        self.ports, self.session_id, self.cookie = ports, session_id, cookie
        self.received = bytearray()
        self.offset = 0
        self.epoch = None
        self.reconnects = 0
        self.viewer: Viewer | None = None

    async def connect(self) -> None:
        delay = 0.1
        for attempt in range(200):
            port = self.ports[attempt % len(self.ports)]  # another daphne, when one is down
            try:
                self.viewer = await Viewer.open(port, self.session_id, self.cookie)
                attached = await self.viewer.attach(
                    since=self.offset, generation=1 if self.offset else None, epoch=self.epoch
                )
                assert attached["lost"] == 0, f"resume lost {attached['lost']} bytes"
                self.offset, self.epoch = attached["offset"], attached["epoch"]
                return
            except (OSError, WebSocketException, AssertionError, TimeoutError) as error:
                if isinstance(error, AssertionError) and "resume lost" in str(error):
                    raise
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
        raise AssertionError("could not reconnect")

    async def read_until(self, marker: bytes, *, during=None, timeout: float = 180) -> bytes:
        deadline = time.monotonic() + timeout
        outage = None
        while marker not in self.received[-4096:]:
            assert time.monotonic() < deadline, f"stuck at {self.offset}; last {bytes(self.received[-200:])!r}"
            if during and outage is None and len(self.received) > 300_000:
                outage = asyncio.create_task(asyncio.to_thread(during))
            try:
                before = len(self.viewer.output)
                await self.viewer._next(5)
                fresh = self.viewer.output[before:]
                self.received += fresh
                self.offset += len(fresh)
            except (ConnectionClosed, TimeoutError):
                self.reconnects += 1
                await self.connect()
        if outage:
            await outage
        return bytes(self.received)


def check_sequence(received: bytes) -> None:
    """Every number exactly once and in order: no gap, no duplicate."""
    received = without_marks(received)  # the shell's command marks are not drawn (docs/commands.md)
    start = received.index(b"\r1\r\n") + 1  # after the echoed command line (and bash's paste-mode escape)
    body = received[start : received.index(b"!DONE!\r\n", start)]
    numbers = body.split(b"\r\n")[:-1]
    assert len(numbers) == COUNT
    assert numbers == [str(i).encode() for i in range(1, COUNT + 1)]


async def test_redis_restart_mid_output_resumes_without_loss_or_duplicate(terminal, operator):
    redis = RedisServer()
    redis.start()
    stack = Stack(redis_url=redis.url)
    try:
        await sync_to_async(stack.start)("local")
        session, cookie = await sync_to_async(terminal)(operator)
        reader = Reader(stack.ports, session.id, cookie)
        await reader.connect()
        await reader.viewer.type(COMMAND)

        def restart_redis():
            redis.stop()
            time.sleep(1)
            redis.start()

        received = await reader.read_until(b"!DONE!\r\n", during=restart_redis)
        check_sequence(received)
    finally:
        await sync_to_async(stack.stop)()
        redis.stop()


async def test_daphne_restart_the_browser_reconnects_to_another_and_resumes(terminal, operator):
    stack = Stack()
    try:
        await sync_to_async(stack.start_daphne)()
        await sync_to_async(stack.start)("local")
        session, cookie = await sync_to_async(terminal)(operator)
        reader = Reader(stack.ports, session.id, cookie)
        await reader.connect()  # to the first daphne
        await reader.viewer.type(COMMAND)

        def kill_first_daphne():
            stack.daphnes[0].kill()  # the daphne this browser is on

        received = await reader.read_until(b"!DONE!\r\n", during=kill_first_daphne)
        assert reader.reconnects >= 1
        check_sequence(received)
        # The stream went on over the direct link the other daphne made to the worker (issue 45), not via Redis.
        assert metric(stack.ports[1], 'tether_links{side="dial"}') == 1
        assert metric(stack.ports[1], "tether_link_fallbacks_total") == 0
    finally:
        await sync_to_async(stack.stop)()
