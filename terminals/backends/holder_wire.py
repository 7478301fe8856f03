"""The session holder's protocol as the worker speaks it (docs/holder.md): frames on its socket (a kind byte
and a length), its answer to ``serve``, its exit record, and a session on one link: attach with the secret
from an offset, then output, acks and the exit in order."""

from __future__ import annotations

import asyncio
import contextlib
import os
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from terminals.backends.base import BackendError, Exit

SOURCE = "the session holder's record"
HEADER = struct.Struct(">BI")
MAX_FRAME = 1024 * 1024  # the holder's own limit, both ways


class Frame:
    ATTACH = ord("A")
    ATTACH_SCREEN = ord("B")  # an attach whose answer is followed by the screen the holder keeps (SCREEN)
    SCREEN = ord("P")  # 8 bytes offset, then a screen there (docs/holder.md); from the holder, empty for none
    INPUT = ord("I")
    RESIZE = ord("R")
    ACK = ord("C")
    KILL = ord("K")
    QUIT = ord("Q")
    ATTACHED = ord("S")
    OUTPUT = ord("O")
    EXIT = ord("E")
    ERROR = ord("Z")


def frame(kind: int, payload: bytes = b"") -> bytes:
    return HEADER.pack(kind, len(payload)) + payload


def parse_record(text: str) -> Exit | None:
    """The holder's exit record ("code=N ..." or "signal=N ..."), or None when it is not one."""
    fields = dict(part.split("=", 1) for part in text.split() if "=" in part)
    try:
        if "signal" in fields:
            return Exit(signal=int(fields["signal"]), source=SOURCE)
        if "code" in fields:
            return Exit(code=int(fields["code"]), source=SOURCE)
    except ValueError:
        pass
    return None


@dataclass(frozen=True)
class Started:
    """``serve``'s answer."""

    holder_pid: int
    holder_start: int
    pid: int  # the program's
    start: int
    subreaper: bool  # every process the program starts stays below the holder (ending.terminate_descendants)


def parse_started(text: str) -> Started:
    """``serve``'s answer: "holder PID START program PID START [subreaper]"."""
    words = text.split()
    known = len(words) in (6, 7) and words[0] == "holder" and words[3] == "program"
    if not known or words[6:] not in ([], ["subreaper"]):
        raise BackendError(f"the holder did not start: {text.strip() or 'no answer'}")
    return Started(int(words[1]), int(words[2]), int(words[4]), int(words[5]), subreaper=len(words) == 7)


class Link(Protocol):
    """A byte stream to the holder: its unix socket, or a docker exec of its relay."""

    async def read(self) -> bytes: ...  # b"" at its end

    async def write(self, data: bytes) -> None: ...

    async def close(self) -> None: ...


class SocketLink:
    """The holder's unix socket. A write the holder no longer takes (it closes its end once it has sent everything,
    a killed program's exit last) is said as BackendError and leaves what it sent before to be read: written through
    the stream's transport, a failed write also ended the reading and dropped what was sent and not yet read (a killed
    shell's exit: its outcome was then recorded unknown). So a write goes to the socket here while the transport
    holds nothing back (in order), and only what the socket does not take at once is left to the transport."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer
        self._fd = writer.get_extra_info("socket").fileno()

    @classmethod
    async def open(cls, path: str) -> SocketLink:
        try:
            return cls(*await asyncio.open_unix_connection(path, limit=2 * MAX_FRAME))
        except OSError as error:
            raise BackendError(f"no holder answers at {path}: {error}") from None

    async def read(self) -> bytes:
        try:
            return await self.reader.read(256 * 1024)
        except OSError:
            return b""

    async def write(self, data: bytes) -> None:
        if self.writer.is_closing():
            raise BackendError("the holder's socket is closed")
        if not self.writer.transport.get_write_buffer_size():
            try:
                data = data[os.write(self._fd, data) :]
            except BlockingIOError:
                pass
            except OSError as error:  # (the holder closed its end: EPIPE; the transport is not told)
                raise BackendError(f"the holder's socket failed: {error}") from None
            if not data:
                return
        try:
            self.writer.write(data)
            await self.writer.drain()
        except (OSError, RuntimeError) as error:  # uvloop: RuntimeError on a handle closed meanwhile
            raise BackendError(f"the holder's socket failed: {error}") from None

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(Exception):
            await self.writer.wait_closed()


@dataclass(frozen=True)
class Attached:
    resume: int  # the offset the stream resumes at
    lost: int  # bytes between the asked offset and the oldest one still kept
    total: int  # bytes the program has written so far
    pid: int
    ended: bool
    # The screen the last owner left with the holder, as (offset, its bytes), when asked for (``screens``).
    screen: tuple[int, bytes] | None = None


class Session:
    """One attached link, read a frame at a time."""

    def __init__(self, link: Link):
        self.link = link
        self.pending = bytearray()

    async def next(self) -> tuple[int, bytes] | None:
        """The next frame, or None when the link ended."""
        while (got := self.ready()) is None:
            data = await self.link.read()
            if not data:
                return None
            self.pending += data
        return got

    def ready(self) -> tuple[int, bytes] | None:
        """The next frame if it has arrived whole, else None (nothing is read)."""
        if len(self.pending) < HEADER.size:
            return None
        kind, length = HEADER.unpack_from(self.pending)
        if length > MAX_FRAME:
            raise BackendError(f"the holder sent a frame of {length} bytes")
        if len(self.pending) < HEADER.size + length:
            return None
        payload = bytes(self.pending[HEADER.size : HEADER.size + length])
        del self.pending[: HEADER.size + length]
        return kind, payload

    def peek(self) -> tuple[int, int] | None:
        """The next frame's type and payload length, once its header is here."""
        return HEADER.unpack_from(self.pending) if len(self.pending) >= HEADER.size else None

    async def attach(self, secret: str, since: int, screens: bool = False) -> Attached:
        """Attach from ``since``; ``screens`` (a holder that keeps one: ``version`` says so) asks for the screen
        left with it too."""
        kind = Frame.ATTACH_SCREEN if screens else Frame.ATTACH
        await self.link.write(frame(kind, secret.encode() + struct.pack(">Q", since)))
        got = await asyncio.wait_for(self.next(), 10)
        if got is None:
            raise BackendError("the holder closed the link at the attach")
        kind, payload = got
        if kind == Frame.ERROR:
            raise BackendError(f"the holder refused the attach: {payload.decode(errors='replace')}")
        if kind != Frame.ATTACHED or len(payload) != 29:
            raise BackendError(f"the holder answered the attach with frame {kind!r}")
        resume, lost, total, pid = struct.unpack_from(">QQQI", payload)
        screen = None
        if screens:
            got = await asyncio.wait_for(self.next(), 10)
            if got is None or got[0] != Frame.SCREEN or (got[1] and len(got[1]) < 8):
                raise BackendError("the holder did not answer with its screen after the attach")
            if got[1]:
                screen = (struct.unpack_from(">Q", got[1])[0], got[1][8:])
        return Attached(resume, lost, total, pid, bool(payload[28]), screen)


Reconnect = Callable[[int], Awaitable[tuple[Session, Attached]]]  # since -> a new attached session
