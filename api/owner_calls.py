"""One question to a worker (the one holding a process, or one serving a machine), answered once on a channel
of this call's own."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from channels.layers import get_channel_layer

from terminals.owner_client import Owner
from terminals.protocol import Message, ToOwner
from transport.layers import LINK_LOST, forget_channel, keep_receiving

ANSWER_SECONDS = 5.0
log = logging.getLogger(__name__)


class NotSent(Exception):
    """The question never left (the channel layer refused it): nothing reached the worker."""


async def ask(owner: Owner, kind: type[ToOwner], *, viewer: str, timeout: float = ANSWER_SECONDS, **fields):
    """Send ``kind`` to ``owner`` and wait for its one answer (the raw message); None when none came (it may
    still have been acted on). Raises ``NotSent`` when it could not be sent at all."""
    owner.route_on(get_channel_layer())
    return await question(
        owner.channel, lambda reply: kind(execution=owner.execution, viewer=viewer, reply=reply, **fields), timeout
    )


async def question(channel: str, message: Callable[[str], Message], timeout: float = ANSWER_SECONDS):
    """Send ``message(reply)`` to ``channel`` and wait for the one answer on ``reply``, a channel of this call's
    own (the raw message); None when none came. Raises ``NotSent`` when it could not be sent at all."""
    layer = get_channel_layer()
    try:
        await keep_receiving(layer)
        reply = await layer.new_channel("tether.api.")
    except Exception as error:
        raise NotSent(repr(error)) from error
    try:
        try:
            await layer.send(channel, message(reply).encode())
        except Exception as error:
            raise NotSent(repr(error)) from error
        try:
            async with asyncio.timeout(timeout):
                # The direct link the question went over dropped (LINK_LOST): its answer may still come the other way.
                while (answer := await layer.receive(reply)).get("type") == LINK_LOST:
                    pass
            return answer
        except TimeoutError:
            return None
        except Exception as error:  # the answer was lost on the way (Redis away): unconfirmed
            log.warning("no answer from %s: %r", channel, error)
            return None
    finally:
        try:
            await forget_channel(layer, reply)
        except Exception as error:
            log.info("could not forget %s: %r", reply, error)
