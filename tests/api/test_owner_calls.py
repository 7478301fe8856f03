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


async def asked(worker_answers, timeout: float) -> dict | None:
    """``question`` to a worker's channel whose worker is ``worker_answers(layer, the question)``."""
    layer = get_channel_layer()
    worker = await layer.new_channel("tether.test-worker.")

    async def work() -> None:
        await worker_answers(layer, await layer.receive(worker))

    working = asyncio.ensure_future(work())
    try:
        return await question(worker, Asked, timeout=timeout)
    finally:
        await working
        await forget_channel(layer, worker)


async def test_a_dropped_link_is_not_the_answer_and_the_answer_that_follows_is():
    async def answer(layer, asked) -> None:
        # The daphne's side of a dropped link says so on the question's own channel; the answer comes after.
        await layer.send(asked["reply"], {"type": LINK_LOST})
        await asyncio.sleep(0.2)
        await layer.send(asked["reply"], {"type": "api.done", "written": 3})

    assert await asked(answer, timeout=5) == {"type": "api.done", "written": 3}


async def test_a_dropped_link_and_no_answer_is_no_answer():
    async def lose(layer, asked) -> None:
        await layer.send(asked["reply"], {"type": LINK_LOST})

    assert await asked(lose, timeout=1) is None
