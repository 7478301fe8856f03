"""Recording the shells a worker holds (docs/recordings.md): output, resizes, command markers and (by setting)
input go to each shell's event log in memory as they happen, and from there to the database in chunks, every
few seconds or sooner when a lot came, fenced by the lease. Taking an event never waits for the database, so a
recording never slows a shell; a worker that dies loses at most its last unwritten moments, which the next
owner's recording says (a gap marker), and it carries on in the same recording.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from channels.db import database_sync_to_async as db
from django.conf import settings

from executions.models import Kind
from terminals import actions
from terminals.asciicast import EventLog
from terminals.live import LiveProcess
from terminals.owner.context import WorkerContext, every

log = logging.getLogger(__name__)

FLUSH_BYTES = 256 * 1024  # this much taken and not yet written: write it now, not at the next turn
SWEEP_SECONDS = 15  # how often a worker finishes recordings whose owner died with their shell


@dataclass
class Take:
    """One shell's recording as its owner takes it."""

    pk: int
    log: EventLog
    chunks: int  # the next chunk's number
    input_recorded: bool
    writing: asyncio.Lock = field(default_factory=asyncio.Lock)
    stopped: bool = False  # the lease was lost: someone else records it now


def stream_of(live: LiveProcess) -> int:
    """The stream a held process's offsets count in: a holder's are the same for every owner (0)."""
    return 0 if live.process.offsets_survive_owner else live.token


class Recorder:
    def __init__(self, context: WorkerContext):
        self.context = context

    async def begin(self, live: LiveProcess, adopted_screen: bytes = b"") -> None:
        """Begin (or, for an adopted shell, go on with) the recording of a terminal session's shell."""
        if not settings.TETHER_RECORDINGS or live.kind != Kind.TERMINAL or not live.session_id:
            return
        now = time.time()
        try:
            recording = await db(actions.begin_recording)(
                execution_pk=live.execution_pk,
                worker=self.context.worker,
                token=live.token,
                cols=live.grid[0],
                rows=live.grid[1],
                started=now,
                stream=stream_of(live),
            )
        except actions.LeaseLost:
            raise
        except Exception:  # a shell is never refused for its recording
            log.exception("execution %s: could not begin its recording", live.execution_pk)
            return
        if recording is None:
            return
        event_log = EventLog(
            started=recording.started_epoch,
            limit=settings.TETHER_RECORDING_MAX_BYTES,
            stream=recording.stream,
            end=recording.output_end,
            size=recording.size,
            output_bytes=recording.output_bytes,
            truncated_at=recording.truncated_at,
        )
        live.recording = Take(recording.pk, event_log, recording.chunks, recording.input_recorded)
        if adopted_screen:
            # An adopted tmux shell's stream starts again with its screen as it is: what the viewer sees.
            event_log.marker("the session moved to another worker; its screen as it was then", now)
            event_log.output(stream_of(live), 0, adopted_screen, now)

    # --- taking events (never waits) -----------------------------------------------------------------

    def output(self, live: LiveProcess, offset: int, data: bytes) -> None:
        if take := self._taking(live):
            take.log.output(stream_of(live), offset, data, time.time())
            self._soon(live, take)

    def input(self, live: LiveProcess, data: bytes) -> None:
        if (take := self._taking(live)) and take.input_recorded:
            take.log.input(data, time.time())
            self._soon(live, take)

    def resize(self, live: LiveProcess, cols: int, rows: int) -> None:
        if take := self._taking(live):
            take.log.resize(cols, rows, time.time())

    def marker(self, live: LiveProcess, label: str) -> None:
        if take := self._taking(live):
            take.log.marker(label, time.time())

    @staticmethod
    def _taking(live: LiveProcess) -> Take | None:
        take = live.recording
        return take if take is not None and not take.stopped else None

    def _soon(self, live: LiveProcess, take: Take) -> None:
        if take.log.pending_bytes >= FLUSH_BYTES and not take.writing.locked():
            self.context.tasks.start(self.flush(live))

    # --- writing -------------------------------------------------------------------------------------

    async def flush(self, live: LiveProcess) -> None:
        """Write what was taken since the last write, fenced by the lease."""
        take = live.recording
        if take is None or take.stopped:
            return
        async with take.writing:
            lines, markers = take.log.take()
            if not lines:
                return
            try:
                await db(actions.write_chunk)(
                    take.pk,
                    worker=self.context.worker,
                    token=live.token,
                    execution_pk=live.execution_pk,
                    number=take.chunks,
                    lines=lines,
                    markers=markers,
                    log_state=take.log,
                )
            except actions.LeaseLost:
                take.stopped = True  # the supervisor lets go; the new owner goes on recording
                return
            except Exception as error:  # the database is away: keep the lines for the next write
                take.log.pending.insert(0, lines)
                take.log.new_markers[:0] = markers
                log.info("execution %s: recording not written yet (%r)", live.execution_pk, error)
                return
            take.chunks += 1

    async def run(self) -> None:
        swept = 0.0

        async def step() -> None:
            nonlocal swept
            for live in list(self.context.live.values()):
                if live.recording is not None and live.recording.log.pending:
                    await self.flush(live)
            if time.monotonic() - swept >= SWEEP_SECONDS:
                swept = time.monotonic()
                await self.sweep()

        await every(settings.TETHER_RECORDING_FLUSH_SECONDS, step, "writing recordings")

    async def sweep(self) -> None:
        """Finish the recordings of shells that ended without their owner finishing them (it died with them)."""
        for pk in await db(actions.unfinished_recordings)():
            await self.finish(pk)

    async def finish(self, recording_pk: int) -> None:
        """The shell has ended and is recorded: its recording becomes one file (see finish_recording)."""
        try:
            if await db(actions.finish_recording)(recording_pk) is not None:
                log.info("recording %s saved", recording_pk)
        except Exception:  # left for the sweep
            log.exception("recording %s: could not save it yet", recording_pk)
