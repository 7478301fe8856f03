"""The screens of a worker's shells, kept by the page's own emulator so that a page that comes back after what the
worker keeps (a reload, a new tab, an outage past the grace) is shown the screen as it is, not a torn tail.

One node process per worker (``emulator.cjs``, @xterm/headless) keeps a terminal per shell, fed the bytes the
shell's output buffer lets go of: its state is always the screen at the buffer's start. A page that asks from
before that start gets that screen, rebuilt as bytes (``serialize.cjs``: both buffers, the cursor, the modes, the
titles), then every byte the buffer keeps, with no gap and no duplicate. A shell that never outgrows the buffer
costs nothing here: its terminal is made at its first byte let go.

The screen is only given where it is exact: a shell whose every byte went through (from its start, under this
worker). One adopted from another worker, whose earlier bytes this one never saw, gets the tail as before. The
process is started on first use and again after it dies; the shells it kept are then no longer exact.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import shutil
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from terminals.children import Child

log = logging.getLogger(__name__)

EMULATOR = Path(__file__).with_name("emulator.cjs")
HEADER = struct.Struct(">cII")  # type, shell, length
GRID = struct.Struct(">HH")  # a kept screen's grid, before it
KEEP_EVERY = 256 * 1024  # bytes fed between screens left with the session holder (acknowledgements wait for them)
KEEP_MOST = 64 * 1024 - 8  # the most a session holder keeps (its frame of output)
BATCH_BYTES = 512 * 1024  # output gathered before it is sent to the emulator (a long plain run: mostly skipped)
BACKLOG_BYTES = 8 * 1024 * 1024  # bytes on their way to the emulator above which a shell's output waits
ANSWER_SECONDS = 5.0  # a screen not answered in this long is not given (the tail is, as before)


@dataclass(frozen=True, slots=True)
class Screen:
    offset: int  # the stream offset the screen is at
    data: bytes  # the screen, then the bytes of a sequence begun before ``offset`` and not yet ended


class Screens:
    """The worker's emulator process, started on first use; one ``ShellScreen`` per shell. Started through
    ``terminals.children`` on raw pipes, as the worker's other programs are (config/loop.py says why)."""

    def __init__(self, scrollback: int = 200, node: str | None = None):
        """``scrollback`` 0: no screens (every shell's is ``inexact``, saying so)."""
        self.scrollback = scrollback
        self.node = node if node is not None else shutil.which("node")
        self._child: Child | None = None
        self._stdin: int | None = None
        self._stdout: int | None = None
        self._outgoing = bytearray()  # written to it as its pipe takes it
        self._incoming = bytearray()
        self._drained: asyncio.Event | None = None
        self._reaping: asyncio.Task | None = None
        self._shells: dict[int, ShellScreen] = {}
        self._next = 0
        self._asked = 0
        self._answers: dict[int, asyncio.Future] = {}
        self.unavailable = "" if self.node else "node is not installed"
        if not scrollback:
            self.unavailable = "screens are off (TETHER_SCREEN_SCROLLBACK=0)"

    def shell(
        self, cols: int, rows: int, *, origin: int, exact: bool, why: str = "", restore: bytes | None = None
    ) -> ShellScreen:
        """A shell's screen from ``origin`` on (``exact``: every byte of the shell from there comes through here;
        ``restore``: the screen at ``origin``, as ``kept`` left it with the session holder)."""
        self._next += 1
        shell = ShellScreen(self, self._next, cols, rows, fed=origin)
        if restore is not None:
            shell.cols, shell.rows, shell.restore = *GRID.unpack_from(restore), restore[GRID.size :]
        shell.inexact = "" if exact else why or "its earlier output was not seen here"
        if self.unavailable:
            shell.inexact = self.unavailable
        return shell

    # --- the process -----------------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._child is not None and self._stdin is not None

    def start(self) -> bool:
        """The process running (started now if it is not). False, with ``unavailable`` saying why, if it cannot."""
        if self.running:
            return True
        if self.unavailable:
            return False
        stdin_read, stdin_write = os.pipe()
        stdout_read, stdout_write = os.pipe()
        try:
            self._child = Child.start(
                [self.node, str(EMULATOR)], stdin=stdin_read, stdout=stdout_write, cwd=str(EMULATOR.parent)
            )
        except OSError as error:
            os.close(stdin_write)
            os.close(stdout_read)
            self.unavailable = f"the screen emulator could not start: {error}"
            log.warning("%s; pages that come back after the kept output get its tail", self.unavailable)
            return False
        finally:
            os.close(stdin_read)
            os.close(stdout_write)
        os.set_blocking(stdin_write, False)
        os.set_blocking(stdout_read, False)
        self._stdin, self._stdout = stdin_write, stdout_read
        self._drained = asyncio.Event()
        self._drained.set()
        asyncio.get_running_loop().add_reader(stdout_read, self._read)
        return True

    def _send(self, kind: bytes, shell: int, payload: bytes = b"") -> bool:
        if not self.running:
            return False
        self._outgoing += HEADER.pack(kind, shell, len(payload))
        self._outgoing += payload
        self._flush()
        return self.running

    def _flush(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._outgoing and self._stdin is not None:
                del self._outgoing[: os.write(self._stdin, self._outgoing)]
        except BlockingIOError:
            self._drained.clear()
            loop.add_writer(self._stdin, self._flush)
            return
        except OSError:
            self._ended()
            return
        if self._stdin is not None:
            loop.remove_writer(self._stdin)
        self._drained.set()

    def backlog(self) -> int:
        return len(self._outgoing)

    async def drain(self) -> None:
        if self._drained is not None:
            await self._drained.wait()

    def _read(self) -> None:
        try:
            data = os.read(self._stdout, 1 << 20)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._ended()
            return
        self._incoming += data
        while len(self._incoming) >= HEADER.size:
            kind, shell, length = HEADER.unpack_from(self._incoming)
            if len(self._incoming) < HEADER.size + length:
                break
            payload = bytes(self._incoming[HEADER.size : HEADER.size + length])
            del self._incoming[: HEADER.size + length]
            if kind == b"S":
                (request,) = struct.unpack_from(">I", payload)
                answer = self._answers.pop(request, None)
                if answer is not None and not answer.done():
                    answer.set_result(payload[4:])
            elif kind == b"E" and (found := self._shells.get(shell)) is not None:
                found.fail(f"the emulator failed: {payload.decode(errors='replace')}")

    def _ended(self) -> None:
        """Gone (or its pipes): every shell it kept is no longer exact; a later shell starts it again."""
        loop = asyncio.get_running_loop()
        child, stdin, stdout = self._child, self._stdin, self._stdout
        if child is None:
            return
        self._child = self._stdin = self._stdout = None
        for fd, remove in ((stdin, loop.remove_writer), (stdout, loop.remove_reader)):
            if fd is not None:
                remove(fd)
                os.close(fd)
        self._outgoing.clear()
        self._incoming.clear()
        if self._drained is not None:
            self._drained.set()
        for shell in list(self._shells.values()):
            shell.opened = False
            shell.fail("the screen emulator ended")
        self._shells.clear()
        for answer in self._answers.values():
            if not answer.done():
                answer.set_result(None)
        self._answers.clear()
        if child is not None:
            self._reaping = loop.create_task(self._reap(child))

    @staticmethod
    async def _reap(child: Child) -> None:
        if child.returncode is None:
            child.kill()
        log.info("the screen emulator ended (%s)", await child.wait())

    async def ask(self, shell: ShellScreen, kind: bytes = b"S") -> bytes | None:
        self._asked += 1
        request = self._asked
        answer = asyncio.get_running_loop().create_future()
        self._answers[request] = answer
        if not self._send(kind, shell.number, struct.pack(">I", request)):
            self._answers.pop(request, None)
            return None
        try:
            return await asyncio.wait_for(answer, ANSWER_SECONDS)
        except TimeoutError:
            self._answers.pop(request, None)
            return None

    async def close(self) -> None:
        """The worker stops: its stdin closed, it exits (killed if it has not in 2 s)."""
        child = self._child
        if child is None:
            return
        for shell in self._shells.values():
            shell.inexact = shell.inexact or "the worker stopped"
        if self._stdin is not None:
            asyncio.get_running_loop().remove_writer(self._stdin)
            os.close(self._stdin)
            self._stdin = None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(child.wait(), 2)
        self._ended()


@dataclass(eq=False)
class ShellScreen:
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
    # every KEEP_EVERY bytes fed; ``release()`` when it cannot be (acknowledgements then wait for none).
    keep: Callable[[int, bytes], Awaitable[None]] | None = None
    release: Callable[[], None] | None = None
    kept: int = 0  # the offset of the screen last left
    keeping: asyncio.Task | None = None
    pending: bytearray = field(default_factory=bytearray)  # fed, not yet sent (sent in BATCH_BYTES pieces)

    def resize(self, cols: int, rows: int, at: int) -> None:
        """The shell's grid is (cols, rows) from stream offset ``at`` on."""
        if at <= self.fed - len(self.pending):
            self._apply(cols, rows)
        else:
            self.resizes.append((at, cols, rows))

    def _apply(self, cols: int, rows: int) -> None:
        self.cols, self.rows = cols, rows
        if self.opened:
            self.screens._send(b"R", self.number, struct.pack(">HH", cols, rows))

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
        self._keep_soon()

    def send(self) -> None:
        """What was fed and not yet sent, to the emulator (each grid change at its offset)."""
        if not self.pending or not self.opened:
            return
        data, self.pending = bytes(self.pending), bytearray()
        offset = self.fed - len(data)
        at = 0
        while self.resizes and self.resizes[0][0] < offset + len(data):
            when, cols, rows = self.resizes.pop(0)
            cut = max(when - offset, at)
            if cut > at:
                self.screens._send(b"D", self.number, data[at:cut])
                at = cut
            self._apply(cols, rows)
        if at < len(data):
            self.screens._send(b"D", self.number, data[at:] if at else data)

    def _keep_soon(self) -> None:
        if self.keep is not None and self.fed - self.kept >= KEEP_EVERY and self.keeping is None:
            self.keeping = asyncio.get_running_loop().create_task(self._keep())

    async def _keep(self) -> None:
        """Leave the screen at ``fed`` with the session holder, for a later owner."""
        try:
            self.send()
            offset = self.fed
            answer = await self.screens.ask(self, b"K")
            if answer is None or self.inexact:
                self.fail(self.inexact or "the screen emulator did not answer")
                return
            screen = self._screen(answer, offset)
            if screen is None:
                self.fail("the screen could not be rebuilt")
                return
            data = GRID.pack(self.cols, self.rows) + screen.data
            if len(data) > KEEP_MOST:
                self.fail(f"its screen ({len(data)} bytes) is more than a session holder keeps")
                return
            await self.keep(offset, data)
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
        if not screens._send(b"O", self.number, payload):
            self.inexact = "the screen emulator was not running"
            return False
        screens._shells[self.number] = self
        self.opened = True
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
        answer = await self.screens.ask(self)
        if answer is None or self.inexact or self.fed != offset:
            return None
        return self._screen(answer, offset)

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
        if self.opened:
            self.screens._send(b"C", self.number)
            self.screens._shells.pop(self.number, None)
            self.opened = False
        self.inexact = self.inexact or "closed"
