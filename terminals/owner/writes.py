"""What a writer does to a held process, the same whoever writes (the window that is its viewer, or an API
client): its keys, seen by the command tracker, written and recorded; and its grid, recorded and told to the
observers at the offset from which output is drawn for it."""

from __future__ import annotations

from recordings.recorder import Recorder
from terminals.owner.commands import CommandTracker
from terminals.owner.live import GRIDS_KEPT, LiveProcess
from terminals.owner.outbox import Outbox
from terminals.protocol import Grid


class Writes:
    """What is written is seen by the session host's command tracker and recorder, and grids told to observers."""

    def __init__(self, commands: CommandTracker, recorder: Recorder, outbox: Outbox):
        self.commands, self.recorder, self.outbox = commands, recorder, outbox

    def writer(self, live: LiveProcess, by: str | None) -> None:
        """``by`` writes from here on (a window attaching as the writer, an API client's keys): a change of
        person is marked in the recording, so nobody writes into another's shell unnoticed."""
        if by and live.writer_name and by != live.writer_name:
            self.recorder.marker(live, f"{by} writes into the shell from here on")
        live.writer_name = by or live.writer_name

    async def keys(self, live: LiveProcess, data: bytes) -> None:
        live.touch()
        await self.commands.typed(live, data)
        await live.process.write(data)
        self.recorder.input(live, data)

    async def grid(self, live: LiveProcess, cols: int, rows: int) -> None:
        """The writer's grid: the process is resized; a change is recorded and told to the observers, at the
        offset from which output is drawn for it."""
        # Under the send lock: output read before the new grid reaches the observers before the word of it.
        async with live.send_lock:
            await live.process.resize(cols, rows)
            if (cols, rows) == live.grid:
                return
            live.grid = (cols, rows)
            live.grids.append((live.buffer.end, cols, rows))
            del live.grids[:-GRIDS_KEPT]
            if live.screen is not None:
                live.screen.resize(cols, rows, live.buffer.end)
            self.recorder.resize(live, cols, rows)
            await self.outbox.to_observers(live, Grid(live.buffer.end, cols, rows, live.token))
