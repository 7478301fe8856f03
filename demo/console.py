"""The demo's two ends of a terminal: a viewer that speaks to the owner worker over the channel layer exactly
as the WebSocket consumer does, and the ``shell`` phase's keyboard and screen.

A real terminal is put in raw mode, as ``docker exec -it`` or ssh would: each key goes to the remote shell as
it is typed, so the remote's echo is the only one, and the terminal's answers to the remote's queries (a
cursor position report, ``ESC [ row ; col R``) reach the program that asked, whole, instead of being glued to
the next typed line. A line that starts with ``:`` is the demo's own command, edited and echoed here and never
sent. Piped input (tests, scripts) is read a line at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import sys
import termios
import time
import tty
from collections.abc import Callable

from channels.db import database_sync_to_async as db
from channels.layers import get_channel_layer

from executions.models import Backend, Machine
from terminals.models import TerminalSession
from terminals.owner_client import OwnerClient, owner_of_session

ESCAPE_SEQUENCE = re.compile(rb"\x1b(\[[0-?]*[ -/]*[@-~]|O.|.)", re.DOTALL)
# What a program asks its terminal (device status and cursor position reports, device attributes). A tmux
# pane's terminal is tmux, which has answered already: our terminal must not answer a second time.
TERMINAL_QUERY = re.compile(rb"\x1b\[[?>=]?[0-9;]*[nc]")
HELP = ":resize COLS ROWS, :interrupt (Ctrl-C), :eof (Ctrl-D), :close (detach; the shell stays)"


class ViewerLost(Exception):
    """No worker answered for the session in time."""


def _backend_of(machine_pk: int) -> str:
    return Machine.objects.values_list("backend", flat=True).get(pk=machine_pk)


class LayerViewer:
    """A viewer of one session over the channel layer, through the same OwnerClient as the WebSocket consumer."""

    def __init__(self, session: TerminalSession):
        self.session = session
        self.layer = get_channel_layer()
        self.output = bytearray()
        self.seq = 0
        self.attached: dict = {}  # the last attach's answer
        self.backend = ""

    async def attach(self, timeout: float = 45.0) -> dict:
        """Attach to whichever worker holds the session, following it when it moves (an adoption)."""
        self.reply = await self.layer.new_channel("demo.viewer.")
        self.client = OwnerClient(self.layer, self.reply, "demo")
        deadline = time.monotonic() + timeout
        attach = 0
        while time.monotonic() < deadline:
            if owner := await db(owner_of_session)(self.session.pk):
                attach += 1
                await self.client.attach(owner, attach=attach, since=0)
                try:
                    answer = await self._receive_until({"terminal.attached", "terminal.error"}, 5)
                except TimeoutError:
                    continue  # nobody there any more (its worker stopped or died): look again
                if answer["type"] == "terminal.attached":
                    self.attached = answer
                    self.backend = await db(_backend_of)(self.session.machine_id)
                    return answer
            await asyncio.sleep(0.2)
        raise ViewerLost(f"no worker took session {self.session.pk} within {timeout:.0f}s")

    async def type(self, data: bytes | str) -> None:
        self.seq += 1
        await self.client.input(data.encode() if isinstance(data, str) else data, self.seq)

    async def resize(self, cols: int, rows: int) -> None:
        await self.client.resize(cols, rows)

    async def take(self, message: dict) -> dict:
        """Keep what a message carries: output is kept and acknowledged, as the page does."""
        if message["type"] == "terminal.output":
            self.output += message["data"]
            await self.client.ack(message["offset"] + len(message["data"]))
        return message

    async def _receive_until(self, kinds: set[str], timeout: float) -> dict:
        async with asyncio.timeout(timeout):
            while True:
                message = await self.take(await self.layer.receive(self.reply))
                if message["type"] in kinds:
                    return message

    async def read_until(self, needle: bytes, timeout: float = 15.0) -> bool:
        """Whether ``needle`` appeared in the output within ``timeout``."""
        deadline = time.monotonic() + timeout
        while needle not in self.output:
            remaining = deadline - time.monotonic()
            message = await self.next_message(remaining) if remaining > 0 else None
            if message is None:
                return False
            await self.take(message)
        return True

    async def next_message(self, timeout: float) -> dict | None:
        try:
            return await asyncio.wait_for(self.layer.receive(self.reply), timeout)
        except TimeoutError:
            return None

    async def detach(self) -> None:
        await self.client.detach()


class Keys:
    """Turns what the keyboard sends into ("send", bytes) for the shell and ("command", text) for the demo."""

    def __init__(self, echo: Callable[[bytes], None]):
        self.echo = echo
        self.at_line_start = True
        self.command: str | None = None

    def feed(self, data: bytes) -> list[tuple[str, bytes | str]]:
        out: list[tuple[str, bytes | str]] = []
        pending = bytearray()
        position = 0
        while position < len(data):
            byte = data[position]
            if self.command is None and byte == 0x1B and (sequence := ESCAPE_SEQUENCE.match(data, position)):
                # A terminal report or a cursor key: the shell's, whole; it starts no new line of ours.
                pending += sequence.group()
                position = sequence.end()
                continue
            position += 1
            if self.command is not None:
                if byte in (0x0D, 0x0A):
                    out.append(("command", self.command))
                    self.command, self.at_line_start = None, True
                    self.echo(b"\r\n")
                elif byte in (0x7F, 0x08):
                    if len(self.command) > 1:
                        self.command = self.command[:-1]
                        self.echo(b"\b \b")
                elif byte == 0x03:  # Ctrl-C drops the half-typed command
                    self.echo(b"^C\r\n")
                    self.command, self.at_line_start = None, True
                elif byte >= 0x20:
                    self.command += chr(byte)
                    self.echo(bytes([byte]))
            elif self.at_line_start and byte == ord(":"):
                if pending:
                    out.append(("send", bytes(pending)))
                    pending.clear()
                self.command = ":"
                self.echo(b":")
            else:
                pending.append(byte)
                self.at_line_start = byte in (0x0D, 0x0A, 0x03, 0x04)
        if pending:
            out.append(("send", bytes(pending)))
        return out


@contextlib.contextmanager
def keyboard():
    """Raw mode on a real terminal for the duration (restored however the shell ends); yields whether raw."""
    fd = sys.stdin.fileno()
    if not os.isatty(fd):
        yield False
        return
    saved = termios.tcgetattr(fd)
    tty.setraw(fd)
    try:
        yield True
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


async def console(viewer: LayerViewer, say: Callable[[str], None], *, queries_answered: bool = False) -> None:
    """Relay the terminal both ways until the shell ends or the user types ``:close``. ``queries_answered``:
    the backend's own terminal (tmux) answers the program's queries, so they are not shown here."""
    loop = asyncio.get_running_loop()
    incoming: asyncio.Queue[bytes] = asyncio.Queue()
    fd = sys.stdin.fileno()
    with keyboard() as raw:

        def show(data: bytes) -> None:
            sys.stdout.buffer.write(data)
            sys.stdout.flush()

        def tell(text: str) -> None:
            say(text.replace("\n", "\r\n") if raw else text)

        keys = Keys(show if raw else lambda data: None)

        def readable() -> None:
            data = os.read(fd, 4096)
            if not data:  # end of input: read no more (an ended pipe stays readable)
                loop.remove_reader(fd)
            incoming.put_nowait(data)

        loop.add_reader(fd, readable)
        printed = 0
        try:
            while True:
                message = await viewer.next_message(0.05)
                if message:
                    await viewer.take(message)
                if len(viewer.output) > printed:
                    fresh = bytes(viewer.output[printed:])
                    show(TERMINAL_QUERY.sub(b"", fresh) if queries_answered else fresh)
                    printed = len(viewer.output)
                if message and message["type"] in ("terminal.exit", "terminal.closed"):
                    tell(f"\n[{message.get('outcome') or message.get('text') or message['type']}]")
                    return
                while not incoming.empty():
                    data = incoming.get_nowait()
                    if not data:  # end of input: detach as :close does
                        await _command(viewer, ":close", tell)
                        return
                    for kind, value in keys.feed(data if raw else data.replace(b"\n", b"\r")):
                        if kind == "send":
                            await viewer.type(value)
                        elif await _command(viewer, value, tell):
                            return
        finally:
            loop.remove_reader(fd)


def _what_stays(viewer: LayerViewer) -> str:
    """What becomes of the shell once this demo's worker stops, as its attach said."""
    if ends := viewer.attached.get("ends_with_worker"):
        return f"the shell ends with it ({ends})"
    keeper = "its tmux server" if viewer.backend == Backend.TMUX else "its session holder"
    return f"the shell stays, held by {keeper}, for the next worker to adopt"


async def _command(viewer: LayerViewer, line: str, tell: Callable[[str], None]) -> bool:
    """Carry out one ``:`` command; True when the console should end."""
    command, *args = line.split()
    if command == ":close":
        await viewer.detach()
        tell(f"\n[detached; this demo's worker stops: {_what_stays(viewer)}]")
        return True
    if command == ":resize" and len(args) == 2 and all(arg.isdigit() for arg in args):
        await viewer.resize(int(args[0]), int(args[1]))
    elif command == ":interrupt":
        await viewer.type(b"\x03")
    elif command == ":eof":
        await viewer.type(b"\x04")
    else:
        tell(f"[unknown command {line!r}: {HELP}]\n")
    return False
