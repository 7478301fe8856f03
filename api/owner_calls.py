"""One question to the worker holding a process, answered once on a channel of this call's own."""

from __future__ import annotations

import asyncio

from channels.layers import get_channel_layer

from terminals.layers import forget_channel, keep_receiving
from terminals.owner_client import Owner
from terminals.protocol import ToOwner

ANSWER_SECONDS = 5.0


async def ask(owner: Owner, kind: type[ToOwner], *, viewer: str, timeout: float = ANSWER_SECONDS, **fields):
    """Send ``kind`` to ``owner`` and wait for its one answer (the raw message); None when none came."""
    layer = get_channel_layer()
    await keep_receiving(layer)
    channel = await layer.new_channel("tether.api.")
    try:
        message = kind(execution=owner.execution, viewer=viewer, reply=channel, **fields)
        await layer.send(owner.channel, message.encode())
        try:
            return await asyncio.wait_for(layer.receive(channel), timeout)
        except TimeoutError:
            return None
    finally:
        await forget_channel(layer, channel)
