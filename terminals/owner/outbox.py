"""Messages from the owner worker to viewers' channels: to the writer, the observers or both, and output cut
to the layer's message size."""

from __future__ import annotations

import asyncio
import logging

from terminals import metrics
from terminals.owner.context import WorkerContext
from terminals.owner.live import OUTPUT_MESSAGE_BYTES, LiveProcess
from terminals.protocol import Message, Output, Watchers

log = logging.getLogger(__name__)


class Outbox:
    """Messages to viewers. A full or vanished channel is not an error here: the viewer resyncs by offset."""

    def __init__(self, context: WorkerContext):
        self.layer = context.layer

    async def send(self, channel: str, message: Message) -> bool:
        try:
            await self.layer.send(channel, message.encode())
        except Exception as error:
            log.info("could not reach viewer %s: %r", channel, error)
            metrics.LAYER_ERRORS.labels("worker_to_viewer").inc()
            return False
        return True

    async def to_viewer(self, live: LiveProcess, message: Message) -> None:
        """To the writer only."""
        if live.viewer is not None:
            await self.send(live.viewer.channel, message)

    async def to_observers(self, live: LiveProcess, message: Message) -> None:
        for observer in list(live.observers.values()):
            await self.send(observer.channel, message)

    async def to_all(self, live: LiveProcess, message: Message) -> None:
        """To the writer and every observer."""
        await self.to_viewer(live, message)
        await self.to_observers(live, message)

    async def output(self, live: LiveProcess, offset: int, data: bytes) -> None:
        """New output: to the writer first (its echo waits on no observer), then to every observer at once."""
        if live.viewer is not None:
            await self.output_to(live.viewer.channel, live, offset, data)
        if live.observers:
            channels = [observer.channel for observer in live.observers.values()]
            await asyncio.gather(*(self.output_to(channel, live, offset, data) for channel in channels))

    async def output_to(self, channel: str, live: LiveProcess, offset: int, data: bytes) -> None:
        """Output (a replay, a resend) to one viewer."""
        for start in range(0, len(data), OUTPUT_MESSAGE_BYTES):
            piece = data[start : start + OUTPUT_MESSAGE_BYTES]
            await self.send(channel, Output(offset + start, piece, live.token))

    async def watchers(self, live: LiveProcess) -> None:
        """Tell the writer and the observers who watches now."""
        said = tuple(observer.said() for observer in live.observers.values())
        await self.to_all(live, Watchers(said, live.token))
