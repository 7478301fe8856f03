"""The worker's emulator process (``emulator.cjs``): started on first use through ``terminals.children`` on raw pipes,
as the worker's other programs are (config/loop.py says why), spoken to in frames, started again after it dies."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import struct
from pathlib import Path

from terminals.children import Child, PipeWriter
from terminals.screen.shell import GRID, ShellScreen, text_of, write_with_grids

log = logging.getLogger(__name__)

EMULATOR = Path(__file__).with_name("emulator.cjs")
HEADER = struct.Struct(">cII")  # type, shell, length
ANSWER_SECONDS = 5.0  # a screen not answered in this long is not given (the tail is, as before)


class Screens:
    """The worker's emulator process, started on first use; one ``ShellScreen`` per shell. Started through
    ``terminals.children`` on raw pipes, as the worker's other programs are (config/loop.py says why)."""

    def __init__(self, scrollback: int = 200, node: str | None = None):
        """``scrollback`` 0: no screens kept (every shell's is ``inexact``, saying so); closed shells' last screens
        are still rendered (``render``)."""
        self.scrollback = scrollback
        self.node = node if node is not None else shutil.which("node")
        self._child: Child | None = None
        self._stdin: int | None = None
        self._stdout: int | None = None
        self._writer: PipeWriter | None = None  # to its stdin, as its pipe takes it
        self._incoming = bytearray()
        self._reaping: asyncio.Task | None = None
        self._shells: dict[int, ShellScreen] = {}
        self._next = 0
        self._asked = 0
        self._answers: dict[int, asyncio.Future] = {}
        self.unavailable = "" if self.node else "node is not installed"
        self.off = "" if scrollback else "screens are off (TETHER_SCREEN_SCROLLBACK=0)"

    def shell(self, cols: int, rows: int, *, origin: int, restore: bytes | None = None) -> ShellScreen:
        """A shell's screen from ``origin`` on, every byte of the shell from there coming through here (``restore``:
        the screen at ``origin``, as ``kept`` left it with the session holder). Asked for only where screens are on
        and node was found (``owner.screens.keep_screen``); an emulator that cannot start fails the shell's screen
        at its first use."""
        self._next += 1
        shell = ShellScreen(self, self._next, cols, rows, fed=origin)
        if restore is not None:
            shell.cols, shell.rows, shell.restore = *GRID.unpack_from(restore), restore[GRID.size :]
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
        self._writer = PipeWriter(stdin_write, on_broken=lambda _: self._ended())
        asyncio.get_running_loop().add_reader(stdout_read, self._read)
        return True

    def _send(self, kind: bytes, shell: int, payload: bytes = b"") -> bool:
        if not self.running:
            return False
        self._writer.write(HEADER.pack(kind, shell, len(payload)), payload)
        return self.running

    def backlog(self) -> int:
        return len(self._writer.outgoing) if self._writer is not None else 0

    async def drain(self) -> None:
        if self._writer is not None:
            await self._writer.drain()

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
            elif kind == b"A" and (found := self._shells.get(shell)) is not None:
                frames, plain = struct.unpack_from(">IB", payload)
                try:
                    found.acked(frames, bool(plain))
                except Exception as error:  # a fault of ours: its screen is no longer trusted, the rest go on
                    found.fail(f"its emulator's word could not be taken: {error!r}")
            elif kind == b"E" and (found := self._shells.get(shell)) is not None:
                found.fail(f"the emulator failed: {payload.decode(errors='replace')}")

    def _ended(self) -> None:
        """Gone (or its pipes): every shell it kept is no longer exact; a later shell starts it again."""
        loop = asyncio.get_running_loop()
        child, stdin, stdout = self._child, self._stdin, self._stdout
        if child is None:
            return
        self._child = self._stdin = self._stdout = None
        if self._writer is not None:
            self._writer.stop()
        if stdin is not None:
            os.close(stdin)
        if stdout is not None:
            loop.remove_reader(stdout)
            os.close(stdout)
        self._incoming.clear()
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
        shell.flush()  # (what it holds back first: the answer is the screen after every byte it was given)
        return await self._ask(shell.number, kind)

    async def render(self, cols: int, rows: int, data: bytes, resizes: list[tuple[int, int, int]] = ()) -> str | None:
        """The rows ``data`` leaves on a blank ``cols`` x ``rows`` terminal, as text (None: no emulator); each of
        ``resizes`` (at, cols, rows) makes it that grid from byte ``at`` of ``data`` on."""
        if not self.start():
            return None
        self._next += 1
        number = self._next
        self._send(b"O", number, json.dumps({"cols": cols, "rows": rows, "scrollback": 0}).encode())
        write_with_grids(
            data,
            resizes,
            lambda piece: self._send(b"D", number, piece),
            lambda new_cols, new_rows: self._send(b"R", number, struct.pack(">HH", new_cols, new_rows)),
        )
        answer = await self._ask(number, b"T")
        self._send(b"C", number)
        return text_of(answer)

    async def _ask(self, number: int, kind: bytes) -> bytes | None:
        self._asked += 1
        request = self._asked
        answer = asyncio.get_running_loop().create_future()
        self._answers[request] = answer
        if not self._send(kind, number, struct.pack(">I", request)):
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
            self._writer.stop()
            os.close(self._stdin)
            self._stdin = None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(child.wait(), 2)
        self._ended()
