"""The API's one question to a worker (api/owner_calls.py) on the real channel layer: a direct link that drops while
the question waits is not taken for its answer."""

from __future__ import annotations

import asyncio

from channels.layers import get_channel_layer

from api.owner_calls import question
from terminals.protocol import Message
from transport.layers import LINK_LOST, forget_channel


class Asked(Message):
    TYPE = "test.asked"

    def __init__(self, reply: str):
        self.reply = reply

    def encode(self) -> dict:
        return {"type": self.TYPE, "reply": self.reply}


async def test_a_dropped_link_is_not_the_answer_and_the_answer_that_follows_is():
    layer = get_channel_layer()
    worker = await layer.new_channel("tether.test-worker.")

    async def answer() -> None:
        asked = await layer.receive(worker)
        # The daphne's side of a dropped link says so on the question's own channel; the answer comes after.
        await layer.send(asked["reply"], {"type": LINK_LOST})
        await asyncio.sleep(0.2)
        await layer.send(asked["reply"], {"type": "api.done", "written": 3})

    answering = asyncio.ensure_future(answer())
    try:
        assert await question(worker, Asked, timeout=5) == {"type": "api.done", "written": 3}
    finally:
        await answering
        await forget_channel(layer, worker)


async def test_a_dropped_link_and_no_answer_is_no_answer():
    layer = get_channel_layer()
    worker = await layer.new_channel("tether.test-worker.")

    async def lose() -> None:
        asked = await layer.receive(worker)
        await layer.send(asked["reply"], {"type": LINK_LOST})

    losing = asyncio.ensure_future(lose())
    try:
        assert await question(worker, Asked, timeout=1) is None
    finally:
        await losing
        await forget_channel(layer, worker)
