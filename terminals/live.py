"""One live process held by the owner worker: its output pump, buffer, viewer and flow control.

The pump reads the process only while the current viewer's unacknowledged
output is under the high watermark (or while nobody views: output then goes
only to the bounded buffer, so a detached session keeps running).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from django.conf import settings

from terminals.backends.base import BackendError, Exit, Process
from terminals.buffer import OutputBuffer

log = logging.getLogger(__name__)

OUTPUT_MESSAGE_BYTES = 64 * 1024  # cap on one channel message's payload


@dataclass
class Viewer:
    channel: str
    viewer_id: str
    acked: int  # absolute offset the viewer has confirmed rendering


@dataclass
class LiveProcess:
    execution_pk: int
    token: int
    kind: str
    process: Process
    session_id: str | None = None
    generation: int = 0
    buffer: OutputBuffer = field(default_factory=lambda: OutputBuffer(settings.TETHER_BUFFER_BYTES))
    viewer: Viewer | None = None
    flow_open: asyncio.Event = field(default_factory=asyncio.Event)
    exit: Exit | None = None
    lost_observation: str = ""  # why no trustworthy exit could be had
    pump_task: asyncio.Task | None = None
    closing: bool = False
    close_reason: str = ""
    handle_backend: str = ""

    def __post_init__(self) -> None:
        self.flow_open.set()

    # --- flow control ----------------------------------------------------------------------

    def in_flight(self) -> int:
        return self.buffer.end - self.viewer.acked if self.viewer else 0

    def update_flow(self) -> None:
        """Pause reading above the high watermark; resume below the low one."""
        if self.viewer is None:
            self.flow_open.set()
        elif self.in_flight() >= settings.TETHER_FLOW_HIGH_BYTES:
            self.flow_open.clear()
        elif self.in_flight() <= settings.TETHER_FLOW_LOW_BYTES:
            self.flow_open.set()

    def ack(self, viewer_id: str, offset: int) -> None:
        if self.viewer and self.viewer.viewer_id == viewer_id:
            # An ack can never move backwards or past what was produced.
            self.viewer.acked = max(self.viewer.acked, min(offset, self.buffer.end))
            self.update_flow()

    # --- reading ---------------------------------------------------------------------------

    async def pump(self, deliver) -> None:
        """Read until the output ends, handing each chunk to ``deliver(offset, data)``."""
        try:
            while True:
                await self.flow_open.wait()
                chunk = await self.process.read()
                if not chunk:
                    break
                offset = self.buffer.append(chunk)
                self.update_flow()
                await deliver(offset, chunk)
        except BackendError as error:
            self.lost_observation = f"output stream failed: {error}"
            log.warning("execution %s: %s", self.execution_pk, self.lost_observation)

    async def observe_exit(self, timeout: float = 30.0) -> Exit | None:
        """The trustworthy exit, or None with ``lost_observation`` saying why there is none."""
        try:
            self.exit = await asyncio.wait_for(self.process.wait(), timeout)
        except (BackendError, TimeoutError) as error:
            self.lost_observation = self.lost_observation or f"no exit could be observed: {error!r}"
            return None
        return self.exit
