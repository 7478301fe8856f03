"""How the owner worker answers API clients (api/owner_calls.py): a read of the output, keys or a grid, each
answered once on the message's own reply channel. No viewer is attached and no flow window is held; a
client's keys are written once per (client, number), and never while another person's window is the writer."""

from __future__ import annotations

import logging

from channels.db import database_sync_to_async as db

from executions import pipes
from terminals.owner.context import WorkerContext
from terminals.owner.live import OUTPUT_MESSAGE_BYTES, LiveProcess
from terminals.owner.outbox import Outbox
from terminals.owner.writes import Writes
from terminals.protocol import MAX_COLS, MAX_ROWS, ApiInput, ApiResize, Done, ErrorCode, Peek, Peeked, ToOwner
from terminals.signals import api_input_taken

log = logging.getLogger(__name__)


def _taken(claim: int) -> bool:
    """Whether the API input numbered by ``claim`` is ours to write (exactly one taker, or its sender giving
    it up, wins)."""
    answers = api_input_taken.send(sender=ApiClients, claim=claim)
    return bool(answers) and all(answer for _, answer in answers)


class ApiClients:
    def __init__(self, context: WorkerContext, outbox: Outbox, writes: Writes):
        self.context, self.outbox, self.writes = context, outbox, writes
        self.handlers = {Peek: self.on_peek, ApiInput: self.on_api_input, ApiResize: self.on_api_resize}

    async def _api_target(self, message: ToOwner, by: str | None = None) -> LiveProcess | None:
        """The running process an API client's message is about; otherwise it is answered why not. With
        ``by`` (keys, a grid): refused while another person's window is the writer, and while a window is
        the writer for a grid (the window sets it)."""
        live = self.context.live.get(message.execution)
        if live is None or live.closing:
            await self.outbox.send(message.reply, Done(False, ErrorCode.NOT_HELD, "the process is not running here"))
            return None
        if by is not None and live.viewer is not None and live.writer_name and live.writer_name != by:
            text = f"{live.writer_name} is writing into this shell from an open window"
            await self.outbox.send(message.reply, Done(False, ErrorCode.NOT_WRITER, text))
            return None
        return live

    async def on_peek(self, message: Peek) -> None:
        if (live := await self._api_target(message)) is None:
            return
        size = min(max(int(message.size), 0), OUTPUT_MESSAGE_BYTES)
        if message.view:
            await self.outbox.send(message.reply, self._peek_view(live, message))
            return
        async with live.send_lock:
            first, data, lost = live.buffer.since(max(int(message.since), 0))
            live.read_by(message.viewer, first)
            peeked = Peeked(
                offset=first,
                data=data[:size],
                start=live.buffer.start,
                end=live.buffer.end,
                lost=lost,
                generation=live.generation,
                epoch=live.token,
                survives=live.process.offsets_survive_owner,
                written=live.process.written_at_attach,
                cols=live.grid[0],
                rows=live.grid[1],
            )
        await self.outbox.send(message.reply, peeked)

    @staticmethod
    def _peek_view(live: LiveProcess, message: Peek) -> Peeked:
        """A read of a command on pipes: the encoded stream from the first whole line of the view with bytes
        at or after ``since`` (its own offsets), and where the view's kept bytes start and end."""
        try:
            view = pipes.View(message.view)
        except ValueError:
            view = pipes.View.ALL
        if live.pipes_index is None:
            live.pipes_index = pipes.Index()
        start = live.buffer.start
        found = live.pipes_index.update(live.buffer.since, start)
        bounds = pipes.first_and_end(found, view, whole=start == 0)
        piece = pipes.starting_at(found, view, max(int(message.since), 0))
        at = piece.at if piece is not None else live.buffer.end
        live.read_by(message.viewer, at)
        # Whole lines from ``at`` (``size`` counts the bytes read out of them: the API's read cuts to it).
        _, data, _ = live.buffer.since(at)
        return Peeked(
            offset=at,
            data=data[:OUTPUT_MESSAGE_BYTES],
            start=live.buffer.start,
            end=live.buffer.end,
            lost=0,
            generation=live.generation,
            epoch=live.token,
            survives=live.process.offsets_survive_owner,
            written=live.process.written_at_attach,
            view_first=bounds[0] if bounds else -1,
            view_end=bounds[1] if bounds else -1,
        )

    async def on_api_input(self, message: ApiInput) -> None:
        if (live := await self._api_target(message, by=message.by)) is None:
            return
        key = (message.viewer, int(message.seq))
        if key not in live.api_written:
            if message.claim and not await db(_taken)(message.claim):
                # Given up by its sender (no answer came in time): it was told nothing was written.
                text = "this input was given up before it was taken; send it again"
                await self.outbox.send(message.reply, Done(False, ErrorCode.NOT_HELD, text))
                return
            live.api_written[key] = True
            while len(live.api_written) > 4096:  # the oldest go: a retry comes within seconds, not hours
                live.api_written.pop(next(iter(live.api_written)))
            self.writes.writer(live, message.by)
            await self.writes.keys(live, message.data)
        else:
            log.info("execution %s: API input %s delivered twice; not written again", live.execution_pk, key)
        await self.outbox.send(message.reply, Done(True))

    async def on_api_resize(self, message: ApiResize) -> None:
        if (live := await self._api_target(message, by="")) is None:
            return
        if live.viewer is not None:
            text = "an open window is the writer and sets the grid"
            await self.outbox.send(message.reply, Done(False, ErrorCode.NOT_WRITER, text))
            return
        if not (1 <= message.cols <= MAX_COLS and 1 <= message.rows <= MAX_ROWS):
            await self.outbox.send(message.reply, Done(False, ErrorCode.BAD_FRAME, "the grid is out of range"))
            return
        await self.writes.grid(live, message.cols, message.rows)
        await self.outbox.send(message.reply, Done(True))
