"""tmux control mode (``tmux -C``), read from a pipe only when the consumer asks.

What a control client reads, one line each:
- ``%output %<pane> <data>``, or ``%extended-output %<pane> <age> ... : <data>`` once ``pause-after`` is
  set; bytes below 32 and the backslash come as ``\\ooo`` octal escapes, every other byte as it is;
- ``%begin <time> <number> <flags>`` ... ``%end`` or ``%error`` with the same time and number around
  the reply to a command (flags 1 for commands this client sent); lines inside are the reply, even
  when they start with ``%`` (``display -p '#{pane_id}'`` prints ``%3``);
- ``%pause %<pane>`` (the pane fell behind ``pause-after``), ``%subscription-changed <name> ... : <value>``,
  ``%exit [reason]`` and other notifications.
"""

from __future__ import annotations

import asyncio
import os
import weakref
from dataclasses import dataclass, field

from terminals.children import DEVNULL, Child, PipeWriter

PIPE_READ = 64 * 1024


# The escapes most output is made of, undone in C (bytes.replace) before any are looked at one by one: a
# line end per line of text (base64 through tmux: 18 ms of the worker's CPU per MB one by one, 4 ms so).
# Safe to do first: every backslash in tmux's output starts an escape, so "\\015" is only ever CR.
COMMON_ESCAPES = ((b"\\015", b"\r"), (b"\\012", b"\n"), (b"\\033", b"\x1b"), (b"\\011", b"\t"), (b"\\010", b"\b"))


def unescape(data: bytes) -> bytes:
    """Undo tmux's escaping: tmux escapes every backslash, so each one starts a three-digit octal code."""
    if b"\\" not in data:
        return data
    # A line end first, in one pass: text through tmux is mostly lines (base64: 5.2 -> 1.2 ms per MB).
    data = data.replace(b"\\015\\012", b"\r\n")
    if b"\\" not in data:
        return data
    for escape, byte in COMMON_ESCAPES:
        data = data.replace(escape, byte)
    if b"\\" not in data:
        return data
    parts = data.split(b"\\")
    out = [parts[0]]
    for part in parts[1:]:
        out.append(bytes((int(part[:3], 8),)))
        out.append(part[3:])
    return b"".join(out)


@dataclass
class Event:
    kind: str  # output, reply, pause, subscription, exit or other
    pane: str = ""
    data: bytes = b""
    lines: list[str] = field(default_factory=list)
    error: bool = False
    ours: bool = False  # a reply to a command this client sent


def parse_line(line: bytes) -> Event:
    if line.startswith(b"%output "):
        _, pane, data = [*line.split(b" ", 2), b""][:3]
        return Event("output", pane=pane.decode(), data=unescape(data))
    if line.startswith(b"%extended-output "):
        head, _, data = line.partition(b" : ")
        return Event("output", pane=head.split(b" ")[1].decode(), data=unescape(data))
    text = line.decode(errors="replace")
    word, _, rest = text.partition(" ")
    if word == "%pause":
        return Event("pause", pane=rest.strip())
    if word == "%subscription-changed":
        name, _, value = rest.partition(" : ")
        return Event("subscription", pane=name.split(" ")[0], lines=[value])
    if word == "%exit":
        return Event("exit", lines=[rest])
    return Event("other", lines=[text])


async def _readable(fd: int) -> None:
    loop = asyncio.get_running_loop()
    ready = loop.create_future()
    loop.add_reader(fd, lambda: ready.done() or ready.set_result(None))
    try:
        await ready
    finally:
        loop.remove_reader(fd)


class ControlReader:
    """Events from a control client's stdout. The pipe is read only inside ``next()``: while nobody asks,
    the pipe fills and tmux stops passing output; what is held here is one read and a partial line."""

    def __init__(self, fd: int):
        self.fd = fd
        self._buffer = bytearray()
        self._eof = False
        self._block: tuple[bytes, list[str]] | None = None
        self._lock = asyncio.Lock()  # a pending read() and detach() may both ask

    def buffered(self) -> bool:
        """Whether a complete line is waiting, so ``next()`` would not touch the pipe."""
        return b"\n" in self._buffer

    def pull(self) -> bool:
        """Take what the pipe holds now, without waiting; whether a complete line is then waiting."""
        if not self._eof and not self._lock.locked():
            try:
                data = os.read(self.fd, PIPE_READ)
            except BlockingIOError:
                data = None
            if data is not None:
                self._eof = not data
                self._buffer += data
        return self.buffered()

    def close(self) -> None:
        """Never touch the fd again (its number may be reused once closed)."""
        self._eof = True

    async def next(self) -> Event | None:
        """The next event, or None once the control client has gone."""
        async with self._lock:
            return await self._next()

    async def _next(self) -> Event | None:
        while True:
            end = self._buffer.find(b"\n")
            if end < 0:
                if self._eof:
                    return None
                await self._fill()
                continue
            line = bytes(self._buffer[:end])
            del self._buffer[: end + 1]
            event = self._take(line)
            if event is not None:
                return event

    def _take(self, line: bytes) -> Event | None:
        if self._block is not None:
            key, lines = self._block
            if line.startswith((b"%end ", b"%error ")) and line.split(b" ")[1:3] == key.split(b" ")[:2]:
                self._block = None
                fields = key.split(b" ")
                return Event("reply", lines=lines, error=line.startswith(b"%error"), ours=fields[2:3] == [b"1"])
            lines.append(line.decode(errors="replace"))
            return None
        if line.startswith(b"%begin "):
            self._block = (line[len(b"%begin ") :], [])
            return None
        return parse_line(line)

    async def _fill(self) -> None:
        while True:
            try:
                data = os.read(self.fd, PIPE_READ)
            except BlockingIOError:
                await _readable(self.fd)
                continue
            if not data:
                self._eof = True
            self._buffer += data
            return


class Sentinel:
    """Finds the shim's end sentinel in the output, across chunk boundaries, and cuts it out."""

    def __init__(self, token: bytes):
        self.token = token
        self.seen = False
        self._carry = b""

    def feed(self, data: bytes) -> bytes:
        if self.seen:
            return data
        data = self._carry + data
        at = data.find(self.token)
        if at >= 0:
            self.seen = True
            self._carry = b""
            return data[:at] + data[at + len(self.token) :]
        # Hold back a tail that could be the start of the token; it starts with the token's only ESC.
        start = data.rfind(self.token[:1], max(0, len(data) - len(self.token) + 1))
        if start >= 0 and self.token.startswith(data[start:]):
            self._carry = data[start:]
            return data[:start]
        self._carry = b""
        return data

    def flush(self) -> bytes:
        held, self._carry = self._carry, b""
        return held


def _close_all(fds: list[int]) -> None:
    while fds:
        os.close(fds.pop())


class ControlClient:
    """A ``tmux -C attach-session`` process on raw pipes: we write commands without waiting for replies,
    and its output is read only through ``reader``. Dropped without ``close()``, its pipes still close."""

    def __init__(self, process: Child, stdin: int, stdout: int):
        self.process = process
        self.reader = ControlReader(stdout)
        self._stdin: int | None = stdin
        self._fds = [stdin, stdout]
        self._finalizer = weakref.finalize(self, _close_all, self._fds)
        self._writer = PipeWriter(stdin)

    @classmethod
    async def start(cls, argv: list[str], env: dict[str, str]) -> ControlClient:
        stdin_read, stdin_write = os.pipe()
        stdout_read, stdout_write = os.pipe()
        try:
            process = Child.start(argv, stdin=stdin_read, stdout=stdout_write, stderr=DEVNULL, env=env)
        except BaseException:
            _close_all([stdin_write, stdout_read])
            raise
        finally:
            _close_all([stdin_read, stdout_write])
        os.set_blocking(stdin_write, False)
        os.set_blocking(stdout_read, False)
        return cls(process, stdin_write, stdout_read)

    @property
    def open(self) -> bool:
        return self._stdin is not None and self._writer.broken is None

    def send(self, command: str) -> None:
        if not self.open:
            broken = self._writer.broken
            raise BrokenPipeError(f"the control client is closed{f': {broken}' if broken else ''}")
        self._writer.write(command.encode() + b"\n")

    async def drain(self) -> None:
        """Wait until every command sent has been handed to tmux (not until it ran)."""
        await self._writer.drain()
        if self._writer.broken is not None:
            raise BrokenPipeError(f"the control client is gone: {self._writer.broken}")

    async def close(self, timeout: float = 5.0) -> None:
        """End the client; the session stays. tmux lets it go only once its queued output is written,
        so that output is read and dropped."""
        if self._stdin is not None:
            self._writer.stop()
            self._fds.remove(self._stdin)
            os.close(self._stdin)
            self._stdin = None
        try:
            async with asyncio.timeout(timeout):
                while await self.reader.next() is not None:
                    pass
                await self.process.wait()
        except TimeoutError:
            await self.process.end()
        finally:
            self.reader.close()
            self._finalizer()
