"""Keeping a terminal's typed commands on the record, from its shell's marks (terminals.marks).

The session host feeds every read of a held shell's output here before it goes to the viewer. A mark
becomes a fenced write (a worker that lost the session writes nothing, and lets go), then a message to the
viewer. A record that could not be written is not guessed at: its command ends ``unknown`` with the
session, or when the next command starts.
"""

from __future__ import annotations

import logging
import time

from channels.db import database_sync_to_async as db

from recordings.recorder import Recorder
from terminals import actions
from terminals.marks import Mark
from terminals.models import CommandSource
from terminals.owner.context import WorkerContext
from terminals.owner.live import LiveProcess
from terminals.owner.outbox import Outbox
from terminals.protocol import CommandSeen

log = logging.getLogger(__name__)

HIDDEN_LABEL = "(a command kept out of the shell's history)"


def command_line(mark: Mark) -> tuple[str, str]:
    """The line a command mark names, and where it is from. History that did not take the line names the
    one before: right for a repeat (the screen shows the same line typed again), but for a line kept out of
    history on purpose (a leading space) it is kept out of the record too."""
    line = mark.command_line
    if mark.fresh:
        return line, CommandSource.HISTORY
    typed, wanted = mark.typed.rstrip("\r\n "), line.strip()
    before = typed[: len(typed) - len(wanted)].rstrip(" ")
    # The same line typed again, right after the prompt (whose last character is no part of a word):
    # not a hidden " cmake" or " sudo make" after a `make`.
    if wanted and typed.endswith(wanted) and (not before or not (before[-1].isalnum() or before[-1] in "_-./")):
        return line, CommandSource.HISTORY
    return "", CommandSource.HIDDEN


class CommandTracker:
    def __init__(self, context: WorkerContext, outbox: Outbox, recorder: Recorder):
        self.context, self.outbox, self.recorder = context, outbox, recorder

    def read(self, live: LiveProcess, offset: int, data: bytes) -> list[Mark]:
        """The marks in a read of the shell's output (no I/O: its recording places them, ``record`` keeps them)."""
        if live.marks is None or not live.session_id:
            return []
        try:
            return live.marks.feed(offset, data)
        except Exception:  # never the output's end: a mark that cannot be read records nothing
            log.exception("execution %s: could not read the marks at offset %s", live.execution_pk, offset)
            live.marks.pending = b""
            return []

    @staticmethod
    def labels(marks: list[Mark]) -> list[tuple[int, str]]:
        """Where each command began in the stream, and its line: the recording's markers."""
        return [(mark.end, command_line(mark)[0] or HIDDEN_LABEL) for mark in marks if mark.kind == "C"]

    async def record(self, live: LiveProcess, marks: list[Mark]) -> None:
        for mark in marks:
            try:
                await self._on(live, mark)
            except actions.LeaseLost:
                raise
            except Exception:
                log.exception("execution %s: could not record a %s mark", live.execution_pk, mark.kind)

    async def typed(self, live: LiveProcess, data: bytes) -> None:
        """The viewer's input, before it is written: Enter at a POSIX shell's prompt (which cannot mark a
        command's start) starts the line the screen shows typed there."""
        reader = live.marks
        if reader is None or not live.session_id or not reader.at_prompt or not (b"\r" in data or b"\n" in data):
            return
        reader.at_prompt = False
        line = reader.line_typed().strip()
        if not line:
            # Nothing shown typed yet: an empty line (no command), or one pasted whole with its Enter, whose
            # record is made at its end, from history. Its recording marks it now, where its output begins.
            pasted = data.split(b"\r")[0].split(b"\n")[0].decode("utf-8", "replace").strip()
            if pasted and pasted.isprintable():
                self.recorder.marker(live, pasted)
            return
        try:
            record, created = await db(actions.command_started)(
                **self._where(live),
                session_pk=live.session_id,
                generation=live.generation,
                stream=self._stream(live),
                output_start=live.buffer.end,
                command=line,
                source=CommandSource.SCREEN,
                shell_time=None,
                evidence=f"started: Enter typed at the shell's prompt, at offset {live.buffer.end}",
            )
        except actions.LeaseLost:
            return  # the supervisor finds out and lets go
        except Exception:
            log.exception("execution %s: could not record a command typed at a prompt", live.execution_pk)
            return
        if created:
            self.recorder.marker(live, line)
            await self.outbox.to_all(live, CommandSeen(actions.command_summary(record), True, live.token))

    def _where(self, live: LiveProcess) -> dict:
        return {"worker": self.context.worker, "token": live.token, "execution_pk": live.execution_pk}

    @staticmethod
    def _stream(live: LiveProcess) -> int:
        return 0 if live.process.offsets_survive_owner else live.token

    async def _on(self, live: LiveProcess, mark: Mark) -> None:
        where, stream = self._where(live), self._stream(live)
        if mark.kind in ("A", "B"):
            if mark.kind == "B":
                live.prompt_shown_at = time.time()
            if not live.marks_seen:
                live.marks_seen = True
                if await db(actions.marks_seen)(live.session_id, live.generation, **where):
                    await self.outbox.to_all(live, CommandSeen(None, True, live.token))
            return
        if mark.kind == "D" and mark.status is not None and (history := mark.history) is not None:
            record = await self._ended_at_prompt(live, mark, history)
            created = record is not None
        elif mark.kind == "C":
            line, source = command_line(mark)
            record, created = await db(actions.command_started)(
                **where,
                session_pk=live.session_id,
                generation=live.generation,
                stream=stream,
                output_start=mark.end,
                command=line,
                source=source,
                shell_time=mark.at,
                prompt=mark.prompt,
            )
        elif mark.kind == "D" and mark.status is not None:
            record = await db(actions.command_finished)(
                **where, stream=stream, offset=mark.start, status=mark.status, shell_time=mark.at, prompt=mark.prompt
            )
            created = record is not None
        else:
            return
        if created:
            await self.outbox.to_all(live, CommandSeen(actions.command_summary(record), True, live.token))

    async def _ended_at_prompt(self, live: LiveProcess, mark: Mark, history: tuple[str, str]):
        """A POSIX shell's end mark: its history's last line tells whether a command ran since the prompt
        before (the line changed) and which; the first one an owner reads only sets where history stands."""
        reader = live.marks
        if mark.end <= reader.history_end:
            return None  # read again from what a holder kept: its earlier owner went past it
        number, line = history
        before, reader.last_history = reader.last_history, history
        took = bool(number) and before is not None and history != before
        reader.history_end = mark.end
        kept = {"generation": live.generation, "number": number, "line": line, "end": mark.end}
        return await db(actions.command_ended_at_prompt)(
            **self._where(live),
            session_pk=live.session_id,
            generation=live.generation,
            stream=self._stream(live),
            offset=mark.start,
            status=mark.status,
            line=line if took else None,
            last=line,
            since=(mark.after, live.prompt_shown_at or time.time()),
            history=kept if history != before else None,
        )
