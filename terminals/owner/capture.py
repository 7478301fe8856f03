"""A command's output as its owner sees it: its last ``TETHER_COMMAND_OUTPUT_BYTES`` and where they start, saved
to the record while it runs (at most every ``SAVE_SECONDS``), so a worker lost mid-run leaves what it saw.

A new owner goes on from the record: a held command's holder resends what nobody acknowledged, at the same
offsets, so the two join; a gap between them is dropped from the head and counted (``output_truncated``). A
stream that cannot be resumed (a tmux pane adopted) goes on after what was saved and is not complete: what
was printed while no worker saw it is not in the record, and how much is not known."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque

from channels.db import database_sync_to_async as db

from executions import pipes
from terminals import actions

log = logging.getLogger(__name__)
SAVE_SECONDS = 1.0


class Capture:
    def __init__(self, limit: int, *, start: int = 0, data: bytes = b"", by_offset: bool = True):
        self.limit = limit
        kept = data[len(data) - limit :] if limit and len(data) > limit else (data if limit else b"")
        self.data = bytearray(kept)
        self.start = start + len(data) - len(kept)
        self.by_offset = by_offset  # offsets go on from the record's (a holder's); else appended after it
        self.complete = by_offset

    @property
    def end(self) -> int:
        return self.start + len(self.data)

    def add(self, offset: int, chunk: bytes) -> None:
        if not self.limit:
            self.start += len(chunk)
            return
        if self.by_offset:
            if offset > self.end:  # never seen by anyone: dropped from the head, counted there
                self.data.clear()
                self.start = offset
            elif offset < self.end:  # resent by a holder: what the record has already
                chunk = chunk[self.end - offset :]
        self.data += chunk
        if len(self.data) > self.limit:
            dropped = len(self.data) - self.limit
            del self.data[:dropped]
            self.start += dropped


class PipesCapture:
    """A command on pipes (executions.pipes): the last ``limit / 2`` bytes of each stream's lines, kept apart,
    so a small stderr is never pushed out of the record by a large stdout. Its record is whole lines of both
    in the order they came (each says where it stands, so what is not kept between them reads as lost). A new
    owner goes on from the record: what a holder resends is joined by each line's place in the streams."""

    def __init__(self, limit: int, *, start: int = 0, data: bytes = b"", by_offset: bool = True):
        self.limit = limit
        self.by_offset = by_offset
        self.complete = by_offset
        # Each stream's lines kept: (their place in the merged sequence, where the line starts, the line).
        self.kept: dict[pipes.View, deque[tuple[int, int, bytes]]] = {
            pipes.View.STDOUT: deque(),
            pipes.View.STDERR: deque(),
        }
        self.sizes = dict.fromkeys(self.kept, 0)
        self.partial = bytearray()
        self.reached = -1  # the merged sequence the lines kept so far have come to
        self.dropped = start > 0  # lines were let go of (or never seen) before the first kept
        self.seen = -1 if data else start  # the encoded offset read to (a record's lines do not say it)
        self._lines(bytes(data), start)

    @property
    def end(self) -> int:
        return self.seen

    @property
    def start(self) -> int:
        """0 when the record is whole from the streams' start (a reader's ``whole``); else where it begins."""
        ats = [kept[0][1] for kept in self.kept.values() if kept]
        return min(ats) if self.dropped and ats else (1 if self.dropped else 0)

    @property
    def data(self) -> bytes:
        lines = sorted([*self.kept[pipes.View.STDOUT], *self.kept[pipes.View.STDERR]])
        return b"".join(line for _, _, line in lines)

    def add(self, offset: int, chunk: bytes) -> None:
        if offset != self.seen:  # a jump: a holder resending (lines kept are known by their place) or a gap
            self.partial.clear()
            self.dropped = self.dropped or (offset > self.seen >= 0 and self.by_offset)
        self.seen = offset + len(chunk)
        if self.limit:
            self.partial += chunk
            taken = self.partial.rfind(b"\n") + 1
            if taken:
                self._lines(bytes(self.partial[:taken]), offset + len(chunk) - len(self.partial))
                del self.partial[:taken]
            if len(self.partial) > 2 * pipes.LINE_BYTES:  # no line is this long: not the mux's
                self.partial.clear()

    def _lines(self, encoded: bytes, origin: int) -> None:
        found, _, self.reached = pipes.parse(encoded, origin, aligned=True, reached=self.reached)
        for piece in found:
            line = encoded[piece.at - origin : encoded.index(b"\n", piece.at - origin) + 1]
            kept = self.kept[piece.stream]
            kept.append((piece.out + piece.err, piece.at, line))
            self.sizes[piece.stream] += len(line)
            while self.sizes[piece.stream] > self.limit // 2 and kept:
                self.sizes[piece.stream] -= len(kept.popleft()[2])
                self.dropped = True


class Saver:
    """Saves a running command's capture to its record: at once after a quiet spell, then at most every
    ``SAVE_SECONDS`` while output comes (one save at a time; fenced by the lease, so only the owner writes)."""

    def __init__(self, context, live, capture: Capture):
        self.context, self.live, self.capture = context, live, capture
        self.task: asyncio.Task | None = None
        self.saved_end = capture.end
        self.last = 0.0

    def poke(self) -> None:
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self._save())

    async def _save(self) -> None:
        wait = self.last + SAVE_SECONDS - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        while self.saved_end != self.capture.end:
            end, data, start = self.capture.end, bytes(self.capture.data), self.capture.start
            self.last = time.monotonic()
            try:
                await db(actions.save_output)(self.live.execution_pk, self.context.worker, self.live.token, data, start)
            except actions.LeaseLost:
                return  # settled, or another owner's now: it is not ours to write
            except Exception as error:  # the database away a moment: the next output tries again
                log.warning("execution %s: could not save its output so far: %r", self.live.execution_pk, error)
                return
            self.saved_end = end
            await asyncio.sleep(SAVE_SECONDS)

    def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
