"""Owned tasks by name (the consumer's): one of a name at a time, replaced by the next, all ended with the socket."""

from __future__ import annotations

import asyncio

from terminals.tasks import Tasks


async def test_an_ack_arriving_while_the_last_one_is_sent_gets_a_timer_of_its_own():
    """The delayed ack gives up its name before it sends: an ack that comes during the send must not find
    the name taken and be dropped (the browser acks only when it renders more, so it would never come again)."""
    tasks = Tasks()
    sending = asyncio.Event()
    sent = []

    async def forward(offset: int) -> None:
        tasks.done_with("ack")
        sending.set()
        await asyncio.sleep(0.05)  # the send to the worker
        sent.append(offset)

    tasks.start(forward(10), name="ack")
    await sending.wait()
    assert not tasks.has("ack")  # so the next ack starts its own timer
    tasks.start(forward(20), name="ack")
    await asyncio.sleep(0.2)
    assert sent == [10, 20]


async def test_a_new_attach_replaces_the_one_still_looking_and_everything_ends_with_the_socket():
    tasks = Tasks()
    ended = []

    async def look(name: str) -> None:
        try:
            await asyncio.sleep(10)
        finally:
            ended.append(name)

    tasks.start(look("first"), name="attach")
    await asyncio.sleep(0)
    tasks.start(look("second"), name="attach")
    tasks.start(look("check"), name="owner_check")
    await asyncio.sleep(0.01)
    assert ended == ["first"]
    await tasks.close()
    assert sorted(ended) == ["check", "first", "second"] and not tasks.running and not tasks.named
