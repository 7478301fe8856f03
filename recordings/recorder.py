"""Recording the shells a worker holds (docs/recordings.md): output, resizes, command markers and (by setting)
input go to each shell's event log in memory as they happen, and from there in chunks, every few seconds or
sooner when a lot came, to files in the recordings storage, each named by a database row fenced by the lease.
Taking an event never waits for the storage or the database, so a recording never slows a shell; a worker that
dies loses at most its last unwritten moments, which the next owner's recording says (a gap marker), and it
carries on in the same recording.
"""

from __future__ import annotations

import asyncio
import logging
import time

from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async as db

from executions.actions import Actor
from executions.models import Kind
from recordings import actions, store
from recordings.actions import ChunksNotHere
from recordings.asciicast import EventLog
from recordings.take import Take
from terminals.actions.fencing import LeaseLost
from terminals.owner.context import DB_OUTAGE, WorkerContext, db_apart, every, until_recorded
from terminals.owner.live import LiveProcess

log = logging.getLogger(__name__)

FLUSH_BYTES = 1024 * 1024  # this much taken and not yet written: write it now, not at the next turn (each write
# costs the worker about a millisecond of CPU in the database thread, however large: 1 MiB a write, not 256 KiB)
SWEEP_SECONDS = 15  # how often a worker finishes recordings whose owner died with their shell
FINISHING_AT_ONCE = 2  # recordings made into files at once, each in a thread of its own


def in_thread(function):
    """``function`` run in a thread of the loop's pool: never the worker's one database thread."""
    return sync_to_async(function, thread_sensitive=False)


def stream_of(live: LiveProcess) -> int:
    """The stream a held process's offsets count in: a holder's are the same for every owner (0)."""
    return 0 if live.process.offsets_survive_owner else live.token


class Recorder:
    def __init__(self, context: WorkerContext):
        self.context = context
        self.finishing = asyncio.Semaphore(FINISHING_AT_ONCE)

    async def begin(self, live: LiveProcess, adopted_screen: bytes = b"") -> None:
        """Begin (or, for an adopted shell, go on with) the recording of a terminal session's shell. A database
        outage is waited out (the shell's output waits meanwhile, so none of it goes unrecorded)."""
        if not self.context.config.recordings or live.kind != Kind.TERMINAL or not live.session_id:
            return
        now = time.time()
        try:
            recording = await until_recorded(
                lambda: db(actions.begin_recording)(
                    execution_pk=live.execution_pk,
                    worker=self.context.worker,
                    token=live.token,
                    cols=live.grid[0],
                    rows=live.grid[1],
                    started=now,
                    stream=stream_of(live),
                )
            )
        except LeaseLost:
            raise
        except Exception:  # a shell is never refused for its recording
            log.exception("execution %s: could not begin its recording", live.execution_pk)
            return
        if recording is None:
            return
        # A shell taken over from an earlier owner has the grid that owner last gave it.
        live.grid = (recording.grid_cols, recording.grid_rows)
        event_log = EventLog(
            started=recording.started_epoch,
            limit=self.context.config.recording_max_bytes,
            grid=live.grid,
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

    def output(self, live: LiveProcess, offset: int, data: bytes, markers: list[tuple[int, str]] = ()) -> None:
        """A read of the shell's output; ``markers``: (stream offset, label) of commands that begin in it."""
        if take := self._taking(live):
            now, stream = time.time(), stream_of(live)
            for at, label in markers:  # each at its own byte: the output before it, the marker, the rest
                if offset <= at <= offset + len(data):
                    take.log.output(stream, offset, data[: at - offset], now)
                    data, offset = data[at - offset :], at
                    if offset >= take.log.end:  # not a replay of what was recorded (and marked) already
                        take.log.marker(label, now)
            take.log.output(stream, offset, data, now)
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
        if take.log.pending_bytes >= FLUSH_BYTES and not take.flush_due:
            take.flush_due = True
            self.context.tasks.start(self.flush(live))

    # --- writing -------------------------------------------------------------------------------------

    async def flush(self, live: LiveProcess, *, final: bool = False) -> None:
        """Write what was taken since the last write, fenced by the lease. ``final``: the shell's output has
        ended, so a database outage is raised for the caller to wait out (nothing would write these records
        later)."""
        take = live.recording
        if take is None or take.stopped:
            return
        async with take.writing:
            take.flush_due = False
            while True:
                retrying = take.unconfirmed is not None
                if retrying:  # the last write's answer was lost: the same chunk again, first
                    taken, file = take.unconfirmed
                else:
                    taken, file = take.log.take(), ""
                    if not taken.lines:
                        return
                try:
                    if not retrying:
                        file = await self._store(live, take, taken)  # ("" when the storage cannot take it)
                    named = await db(actions.write_chunk)(
                        take.pk,
                        worker=self.context.worker,
                        token=live.token,
                        execution_pk=live.execution_pk,
                        number=take.chunks,
                        taken=taken,
                        file=file,
                        data=None if file else taken.lines,
                    )
                except LeaseLost:
                    take.stopped = True  # the supervisor lets go; the new owner goes on recording
                    await self._forget(file)
                    return
                except asyncio.CancelledError:  # (the worker stopping, in the storage's write or the database's):
                    take.unconfirmed = (taken, file)  # its last flush writes them again, first, as after an outage
                    raise
                except Exception as error:  # the database is away: this chunk is written again, first
                    # Whether its row was committed is not known; written again under the same number and
                    # file, it is named once either way (write_chunk), and the events after it wait.
                    take.unconfirmed = (taken, file)
                    if final and isinstance(error, DB_OUTAGE):
                        raise
                    log.warning("execution %s: recording not written yet (%r)", live.execution_pk, error)
                    return
                take.unconfirmed = None
                if not named:  # the recording is finished (or the number went to another chunk)
                    await self._forget(file)
                take.chunks += 1
                if not retrying:
                    return

    async def _store(self, live: LiveProcess, take: Take, taken) -> str:
        """The chunk's events as a file in the recordings storage, in a thread of its own (never the one
        heartbeats and fenced writes wait on); "" when the storage cannot take them: they then go in the row,
        and the recording loses nothing while the storage is away."""
        try:
            return await in_thread(store.save_chunk)(take.pk, take.chunks, taken.lines)
        except Exception as error:
            log.warning(
                "execution %s: the recordings storage did not take a chunk (%r); it is kept in the database",
                live.execution_pk,
                error,
            )
            return ""

    @staticmethod
    async def _forget(file: str) -> None:
        if file:
            try:
                await in_thread(store.remove_chunk)(file)
            except Exception:  # the cleanup removes it once the recording is a file
                log.warning("could not remove the unnamed recording chunk %s", file, exc_info=True)

    async def flush_last(self, live: LiveProcess) -> None:
        """The shell's output has ended: write the rest, waiting out a database outage."""
        await until_recorded(lambda: self.flush(live, final=True))

    async def run(self) -> None:
        swept = 0.0

        async def step() -> None:
            nonlocal swept
            for live in list(self.context.live.values()):
                if live.recording is not None and (live.recording.log.pending or live.recording.unconfirmed):
                    await self.flush(live)
            if time.monotonic() - swept >= SWEEP_SECONDS:
                swept = time.monotonic()
                await self.sweep()

        await every(self.context.config.recording_flush_seconds, step, "writing recordings")

    async def clean_up(self, actor: Actor) -> None:
        """The retention: remove the recordings past it, and the chunk files of recordings no longer being made."""
        if removed := await db(actions.expire_recordings)(actor=actor):
            log.info("retention: removed %d recording(s) past their retention", len(removed))
        if leftover := await db_apart(actions.remove_leftover_chunks)():  # a listing and deletes
            log.info("removed %d chunk file(s) of recordings no longer being made", leftover)

    async def sweep(self) -> None:
        """Finish the recordings of shells that ended without their owner finishing them (it died with them)."""
        for pk in await db(actions.unfinished_recordings)():
            await self.finish(pk)

    async def finish(self, recording_pk: int) -> None:
        """The shell has ended and is recorded: its recording becomes one file (see finish_recording). Made in
        a thread of its own, never the one the worker's heartbeats and fenced writes wait on."""
        try:
            async with self.finishing:
                finished = await db_apart(actions.finish_recording)(recording_pk)
        except ChunksNotHere as error:  # left for a finisher whose storage has them
            log.warning("%s; left for another worker", error)
            return
        except Exception:  # left for the sweep
            log.exception("recording %s: could not save it yet", recording_pk)
            return
        if finished is not None:
            log.info("recording %s saved (%d bytes)", recording_pk, finished.file_bytes)
