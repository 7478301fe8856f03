"""One shell's terminal in the worker's emulator (``process.Screens``): fed what its buffer lets go of, asked for
the screen, and leaving it with the session holder for a later owner."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from terminals.screen.frames import GRID, KEEP_MOST, Frames

log = logging.getLogger(__name__)

BATCH_BYTES = 1024 * 1024  # output gathered before it is sent to the emulator (a long plain run: mostly cut)
SEND_WITHIN = 1.0  # seconds output waits short of a batch before it is looked at (sent, or held cut short)
BACKLOG_BYTES = 8 * 1024 * 1024  # bytes on their way to the emulator above which a shell's output waits


class Screens(Protocol):
    """What a shell's screen asks of the emulator process (``process.Screens``)."""

    scrollback: int
    unavailable: str
    _shells: dict[int, ShellScreen]

    def start(self) -> bool: ...

    def _send(self, kind: bytes, shell: int, payload: bytes = b"") -> bool: ...

    def backlog(self) -> int: ...

    async def drain(self) -> None: ...

    async def ask(self, shell: ShellScreen, kind: bytes = b"S") -> bytes | None: ...


def write_with_grids(
    data: bytes, grids: list[tuple[int, int, int]], write: Callable[[bytes], None], regrid: Callable[[int, int], None]
) -> None:
    """``data`` written in pieces, each of ``grids`` (at, cols, rows: ``at`` a byte of ``data``, in order; one before
    the start counts from it) made at its byte."""
    at = 0
    for cut, cols, rows in grids:
        cut = max(cut, at)
        if cut > at:
            write(data[at:cut])
            at = cut
        regrid(cols, rows)
    if at < len(data):
        write(data[at:] if at else data)


def text_of(answer: bytes | None) -> str | None:
    """A ``T`` answer's text (None: none)."""
    if answer is None or answer[0] != 0:
        return None
    return answer[5:].decode("utf-8", "replace")


@dataclass(frozen=True, slots=True)
class Screen:
    offset: int  # the stream offset the screen is at
    data: bytes  # the screen, then the bytes of a sequence begun before ``offset`` and not yet ended
    cols: int = 0  # the grid it is drawn for
    rows: int = 0


@dataclass(frozen=True, slots=True)
class LastScreen:
    """A closed shell's last screen, as the rows its page showed (text), and whether every byte it was drawn from
    was there (else it is drawn from the output kept, and rows drawn before may be missing)."""

    text: str
    exact: bool


@dataclass(eq=False)
class ShellScreen(Frames):
    """One shell's terminal in the emulator: fed what its buffer lets go of, in order."""

    screens: Screens
    number: int
    cols: int
    rows: int
    fed: int  # the stream offset of the next byte it is to be given
    inexact: str = ""  # why the screen it keeps is not the shell's ("" while it is)
    opened: bool = False
    resizes: list[tuple[int, int, int]] = field(default_factory=list)  # (offset, cols, rows) not yet applied
    restore: bytes | None = None  # the screen at ``fed`` it starts from (left with the session holder)
    # Where its screen is left for a later owner (a session holder that keeps one): ``keep(offset, data)``
    # every ``keep_every`` bytes fed (what its ring holds: holder.screen_every); ``release()`` when it cannot be
    # (acknowledgements then wait for none).
    keep: Callable[[int, bytes], Awaitable[None]] | None = None
    release: Callable[[], None] | None = None
    keep_every: int = 256 * 1024
    kept: int = 0  # the offset of the screen last left
    keeping: asyncio.Task | None = None
    pending: bytearray = field(default_factory=bytearray)  # fed, not yet sent (sent in BATCH_BYTES pieces)
    sending: asyncio.TimerHandle | None = None  # sends what is pending SEND_WITHIN after it began to be

    def resize(self, cols: int, rows: int, at: int) -> None:
        """The shell's grid is (cols, rows) from stream offset ``at`` on."""
        if at <= self.fed - len(self.pending):
            self._apply(cols, rows)
        else:
            self.resizes.append((at, cols, rows))

    def _apply(self, cols: int, rows: int) -> None:
        self.flush()
        self.cols, self.rows = cols, rows
        if self.opened:
            self._frame(b"R", struct.pack(">HH", cols, rows))
            self._unchained()

    def feed(self, offset: int, data: bytes) -> None:
        """The bytes from stream offset ``offset`` on, let go of by the buffer (called in order, with no gap)."""
        if self.inexact:
            return
        if offset < self.fed:  # before the screen it started from (an adopter's buffer begins earlier)
            data, offset = data[self.fed - offset :], max(offset, self.fed)
            if not data:
                return
        if offset != self.fed:
            self.fail(f"its stream jumped from {self.fed} to {offset}")
            return
        if not self.opened:
            if not self._open():
                return
        # Gathered and sent in large pieces: of a long plain run, the more at once, the less is written.
        self.pending += data
        self.fed = offset + len(data)
        if len(self.pending) >= BATCH_BYTES:
            self.send()
        elif self.sending is None:
            self.sending = asyncio.get_running_loop().call_later(SEND_WITHIN, self._send_waiting)
        self._keep_soon()

    def _send_waiting(self) -> None:
        self.sending = None
        if not self.inexact:
            self.send()

    def send(self) -> None:
        """What was fed and not yet sent, to the emulator (each grid change at its offset)."""
        if not self.pending or not self.opened:
            return
        data, self.pending = bytes(self.pending), bytearray()
        offset = self.fed - len(data)
        due = []
        while self.resizes and self.resizes[0][0] < offset + len(data):
            when, cols, rows = self.resizes.pop(0)
            due.append((when - offset, cols, rows))
        write_with_grids(data, due, self._write, self._apply)

    def _keep_soon(self) -> None:
        if self.keep is not None and self.fed - self.kept >= self.keep_every and self.keeping is None:
            self.keeping = asyncio.get_running_loop().create_task(self._keep())

    async def _keep(self) -> None:
        """Leave the screen at ``fed`` with the session holder, for a later owner."""
        keep = self.keep  # (the shell's end lets go of it meanwhile: this one still finishes)
        try:
            if keep is None:
                return
            self.send()
            offset = self.fed
            data = self._held_screen()
            if data is None:
                self.flush()
                frames = self.frames
                answer = await self.screens.ask(self, b"K")
                if answer is None or self.inexact:
                    self.fail(self.inexact or "the screen emulator did not answer")
                    return
                screen = self._screen(answer, offset)
                if screen is None:
                    self.fail("the screen could not be rebuilt")
                    return
                data = GRID.pack(self.cols, self.rows) + screen.data
                # Later screens are this one (which ends with what its last frame left unfinished) and what is held
                # after it, while nothing else is sent.
                self.base = (frames, screen.data)
            if len(data) > KEEP_MOST:
                self.fail(f"its screen ({len(data)} bytes) is more than a session holder keeps")
                return
            await keep(offset, data)
            self.kept = offset
        except Exception as error:  # the link to the holder: its reader finds out; acks go on without a screen
            self.fail(f"its screen could not be left with the session holder: {error!r}")
            self.keeping = None
        else:
            self.keeping = None
            self._keep_soon()  # more came meanwhile

    def fail(self, why: str) -> None:
        """No longer exact: no screen is given, and none is kept for a later owner."""
        if not self.inexact:
            log.info("screen %s is no longer kept: %s", self.number, why)
        self.inexact = self.inexact or why
        self.keep = None
        if self.release is not None:
            self.release()
            self.release = None

    def _open(self) -> bool:
        screens = self.screens
        if not screens.start():
            self.fail(screens.unavailable)
            return False
        opening = {"cols": self.cols, "rows": self.rows, "scrollback": screens.scrollback}
        if self.restore is not None:
            opening["screen"] = base64.b64encode(self.restore).decode()
        payload = json.dumps(opening).encode()
        if not self._frame(b"O", payload):
            self.inexact = "the screen emulator was not running"
            return False
        screens._shells[self.number] = self
        self.opened = True
        self._unchained()
        return True

    async def ready(self) -> None:
        """Before output that makes the buffer let go of bytes: waits while the emulator is behind, so the
        shell's output waits on it rather than the worker's memory growing."""
        if self.inexact:
            return
        if self.screens.backlog() > BACKLOG_BYTES:
            await self.screens.drain()

    async def screen(self) -> Screen | None:
        """The screen at ``fed`` (the buffer's start): None when it is not exact or not answered in time. The
        caller holds the shell's send lock, so nothing more is fed meanwhile."""
        if not self.opened:
            await self.ready()
            if self.inexact or not self._open():
                return None
        if self.inexact:
            return None
        self.send()
        offset = self.fed
        grid = self.cols, self.rows
        answer = await self.screens.ask(self)
        if answer is None or self.inexact or self.fed != offset:
            return None
        screen = self._screen(answer, offset)
        return None if screen is None else Screen(screen.offset, screen.data, *grid)

    async def text(self, offset: int, rest: bytes) -> str | None:
        """The rows it shows once ``rest`` (every byte the buffer keeps, from ``offset``: the shell has ended) is
        written, as text; None when it is not exact."""
        if self.inexact or not (self.opened or self._open()):
            return None
        self.keep = None  # ended: no screen is left with the session holder any more
        self.feed(offset, rest)
        self.send()
        for _, cols, rows in self.resizes:  # the grid it has now, whatever came last
            self._apply(cols, rows)
        self.resizes.clear()
        answer = await self.screens.ask(self, b"T")
        return None if self.inexact else text_of(answer)

    @staticmethod
    def _screen(answer: bytes, offset: int) -> Screen | None:
        if answer[0] != 0:
            log.info("no screen: %s", answer[5:].decode(errors="replace"))
            return None
        (pending,) = struct.unpack_from(">I", answer, 1)
        unread = answer[5 : 5 + pending]
        # The page writes the screen, then those bytes (which begin a sequence the stream goes on with).
        return Screen(offset=offset, data=answer[5 + pending :] + unread)

    def close(self) -> None:
        if self.keeping is not None:
            self.keeping.cancel()
        if self.sending is not None:
            self.sending.cancel()
        if self.opened:
            self.screens._send(b"C", self.number)
            self.screens._shells.pop(self.number, None)
            self.opened = False
        self.inexact = self.inexact or "closed"
