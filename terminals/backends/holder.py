"""The session holder's client (holder/tether-holder.c; the protocol in docs/holder.md).

A held program belongs to the holder, not to the worker: the worker attaches to it over a link (the
holder's unix socket on this host, or a ``docker exec`` of the holder's relay in a container), reads its
output by absolute offset, and lets go without touching it. A later worker, on any host that can reach
the link, attaches again from the offset it needs. The exit comes from the holder, which saw the
program's own wait status and wrote it to a file before it said so: never from a dropped stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path

from terminals.backends.base import READ_CHUNK, BackendError, Exit, Process
from terminals.backends.config import holder_config
from terminals.backends.handles import DockerHandle, LocalHandle
from terminals.backends.holder_wire import Attached, Frame, Reconnect, Session, frame, parse_record

log = logging.getLogger(__name__)

INPUT_FRAME = 64 * 1024  # input per frame; the holder drops a client that sends more
ACK_EVERY = 64 * 1024
RECORD_POLL_SECONDS = 0.1


HOLDER_DEFAULT_RING = 1024 * 1024  # the ring of a holder started without --ring (holder/tether-holder.c)
HOLDER_MAX_RING = 256 * 1024 * 1024  # the most --ring takes
SCREEN_EVERY = 1024 * 1024  # the most output between screens left with a holder (each costs the emulator ~1 ms)


def ring_bytes() -> int:
    """The ring a new holder gets: TETHER_HOLDER_RING_BYTES, raised to fit the worker's own buffer and two
    acknowledgements more. The worker acknowledges only what its buffer no longer needs; a ring no larger
    than the buffer was never acknowledged, filled, and froze the shell (and its Kill) at 1 MiB. With screens
    kept, raised to fit twice SCREEN_EVERY more (``screen_every``: the fewer screens left, the less they cost; and
    the holder reads on while the next is made). A ring's memory is only taken as output fills it."""
    config = holder_config()
    wanted = max(config.ring_bytes, config.buffer_bytes + 2 * ACK_EVERY)
    if config.screens:
        wanted = max(wanted, config.buffer_bytes + 2 * SCREEN_EVERY + 4 * ACK_EVERY)
    return min(wanted, HOLDER_MAX_RING)


def screen_every(ring: int) -> int:
    """Output between screens the worker leaves with a holder whose ring is ``ring``: half what the ring holds past
    the worker's buffer and some acknowledgements, SCREEN_EVERY at most. Acknowledgements wait for the screen: one
    left further apart would fall out of the ring before the next, and with less room the holder stops reading
    while the next is made (a third less output in `make bench`'s screens with the half left: docs/benchmarks.md)."""
    return max(64 * 1024, min(SCREEN_EVERY, (ring - holder_config().buffer_bytes - 4 * ACK_EVERY) // 2))


def kept_behind(ring: int) -> int:
    """How much the worker leaves unacknowledged in a holder whose ring is ``ring`` (started by any release,
    with any settings): its buffer, as long as that leaves the holder room to read on."""
    return max(0, min(holder_config().buffer_bytes, ring - 2 * ACK_EVERY))


def holder_binary() -> Path | None:
    """The built holder, or None where it was not built (held sessions then fall back to plain ones)."""
    config = holder_config()
    path = Path(config.binary)
    return path if config.enabled and path.is_file() else None


_VERSIONS: dict[tuple[str, float, int], str] = {}


def holder_screens(binary: Path) -> bool:
    """Whether ``binary`` keeps a screen for the next owner (``version`` says ``screens``): asked once per file
    (a deploy may replace it under a running worker; a holder keeps the code it was started from)."""
    try:
        stat = binary.stat()
    except OSError:
        return False
    key = (str(binary), stat.st_mtime, stat.st_size)
    if key not in _VERSIONS:
        try:
            done = subprocess.run([str(binary), "version"], capture_output=True, timeout=10)
            _VERSIONS[key] = done.stdout.decode(errors="replace")
        except (OSError, subprocess.TimeoutExpired):
            return False
    return "screens" in _VERSIONS[key].split()[2:]


def mux_program() -> str:
    """The built holder, which runs a command on pipes (``tether-holder mux``) whether or not shells are held
    (TETHER_HOLDER). Raises BackendError when it is not built."""
    path = Path(holder_config().binary)
    if not path.is_file():
        raise BackendError(
            f"a command on pipes (pty: false) needs the session holder (tether-holder), not built here ({path})"
        )
    return str(path)


class HeldProcess(Process):
    """A program held by a session holder, as its current owner sees it."""

    survives_owner = True  # a later worker attaches to the holder again
    offsets_survive_owner = True  # offsets are the holder's: a viewer's offset from an earlier owner holds

    def __init__(
        self,
        handle: LocalHandle | DockerHandle,
        session: Session,
        attached: Attached,
        *,
        reconnect: Reconnect,
        read_record: Callable[[], Awaitable[Exit | None]],
        end_tree: Callable[[float], Awaitable[None]],
        forget: Callable[[], Awaitable[None]],
        holder_alive: Callable[[], Awaitable[bool]],
    ):
        self.handle = handle
        self._holder_alive = holder_alive
        self._link_lost = ""  # why the link to the holder is gone for good (attaching again failed)
        self._session = session
        self._reconnect = reconnect
        self._read_record = read_record
        self._end_tree = end_tree
        self._forget = forget
        self.stream_origin = attached.resume
        self.written_at_attach = attached.total
        self.lost_at_attach = attached.lost
        self.pid = attached.pid
        self._received = attached.resume
        self._acked = attached.resume
        # What the holder keeps behind us (our buffer, rebuilt by a later owner), with room left to read on.
        self._keep = kept_behind(handle.holder.ring or HOLDER_DEFAULT_RING)
        # The screen a later owner rebuilds from is the one left with the holder (``keep_screen``), at this
        # offset: the holder keeps every byte after it (acknowledgements stop there). None: no screen is kept.
        self.screen_kept: int | None = None
        self.kept_screen = attached.screen  # the one the last owner left, as (offset, bytes)
        self._exit: Exit | None = None
        self._ended = asyncio.Event()
        self._reading = asyncio.Lock()
        self._closed = False

    async def read(self) -> bytes:
        async with self._reading:
            while not self._ended.is_set():
                got = await self._next()
                if got is None:
                    continue  # reconnected
                kind, payload = got
                if kind == Frame.OUTPUT and len(payload) >= 8:
                    data = self._output(payload)
                    # Output frames already here whole go out with it: fewer, larger chunks for every hop after.
                    parts = [data]
                    size = len(data)
                    while (ahead := self._session.peek()) and ahead[0] == Frame.OUTPUT:
                        if size + ahead[1] - 8 > READ_CHUNK:
                            break
                        more = self._session.ready()
                        if more is None:
                            break
                        parts.append(self._output(more[1]))
                        size += len(parts[-1])
                    await self._ack()
                    return data if len(parts) == 1 else b"".join(parts)
                if kind == Frame.EXIT:
                    self._exit = parse_record(payload.decode(errors="replace"))
                    self._ended.set()
                elif kind == Frame.ERROR:
                    raise BackendError(f"the holder closed the link: {payload.decode(errors='replace')}")
            return b""

    async def _next(self) -> tuple[int, bytes] | None:
        """The next frame; None after a link that dropped was attached again (the holder still runs)."""
        try:
            got = await self._session.next()
        except (OSError, BackendError) as error:
            got, why = None, repr(error)
        else:
            why = "the link ended"
        if got is not None:
            return got
        if self._closed:
            self._ended.set()
            return None
        for attempt in range(5):
            await asyncio.sleep(0.2 * attempt)
            try:
                session, attached = await self._reconnect(self._received)
            except (OSError, BackendError, TimeoutError) as error:
                why = f"{why}; attaching again failed: {error!r}"
                continue
            if attached.resume != self._received:
                await session.link.close()
                raise BackendError(f"the holder resumed at {attached.resume}, not at {self._received}")
            log.info("holder link for %s dropped (%s); attached again", self.handle.marker, why)
            await self._session.link.close()
            self._session = session
            return None
        self._link_lost = why
        raise BackendError(f"the holder's link is gone: {why}")

    def _output(self, payload: bytes) -> bytes:
        (offset,) = struct.unpack_from(">Q", payload)
        if offset != self._received:
            raise BackendError(f"the holder's stream jumped from {self._received} to {offset}")
        self._received += len(payload) - 8
        return payload[8:]

    @property
    def keeps_screens(self) -> bool:
        return bool(self.handle.holder.screens)

    @property
    def screen_every(self) -> int:
        return screen_every(self.handle.holder.ring or HOLDER_DEFAULT_RING)

    async def keep_screen(self, offset: int, data: bytes) -> None:
        """Leave the screen at ``offset`` with the holder (for the next owner); output before it may then go."""
        await self._session.link.write(frame(Frame.SCREEN, struct.pack(">Q", offset) + data))
        self.screen_kept = max(self.screen_kept or 0, offset)
        await self._ack()

    async def _ack(self) -> None:
        upto = self._received - self._keep
        if self.screen_kept is not None:
            # Not past the screen left for the next owner; but never so far behind that the holder stops reading
            # (a screen that falls behind is then not the next owner's: it finds it older than what is kept).
            ring = self.handle.holder.ring or HOLDER_DEFAULT_RING
            upto = max(min(upto, self.screen_kept), self._received - (ring - 2 * ACK_EVERY))
        if upto - self._acked >= ACK_EVERY:
            self._acked = upto
            # A holder that has gone (it ends once the program has and it sent everything) cannot take it, and
            # needs none: what is read next says how the link ended (the exit, or a reattach that resumes).
            with contextlib.suppress(BackendError):
                await self._session.link.write(frame(Frame.ACK, struct.pack(">Q", upto)))

    async def write(self, data: bytes) -> None:
        view = memoryview(data)
        for start in range(0, len(view), INPUT_FRAME):
            await self._session.link.write(frame(Frame.INPUT, bytes(view[start : start + INPUT_FRAME])))

    async def resize(self, cols: int, rows: int) -> None:
        await self._session.link.write(frame(Frame.RESIZE, struct.pack(">HH", cols, rows)))

    async def wait(self) -> Exit:
        """The holder's exit frame once the output has been read to its end (as an owner pumps it), or
        its record, written when it reaped the program, whichever comes first; the output is not touched."""
        while not self._ended.is_set():
            if (exit := await self._read_record()) is not None:
                return exit
            if self._link_lost and not await self._holder_alive():
                await self._after_holder_died()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._ended.wait(), RECORD_POLL_SECONDS)
        exit = self._exit or await self._read_record()
        if exit is None:
            raise BackendError("the holder's link ended before the program did, and it left no record")
        return exit

    async def _after_holder_died(self) -> None:
        """The holder died (killed from outside) without a record: nobody can observe the program any more, so
        what still carries the session's marker (a background job the hang-up did not end) is ended, and the
        end is not known (raises)."""
        if (await self._read_record()) is not None:
            return  # it recorded the end just before it went: read on the next turn
        gone = "the session holder is gone and left no exit record"
        try:
            await self._end_tree(1.0)
        except BackendError as error:
            raise BackendError(f"{gone}; ending what it left failed: {error}") from None
        raise BackendError(f"{gone}; what carried the session's marker was ended")

    async def terminate(self, grace: float = 2.0) -> Exit | None:
        """The holder ends the program's session (HUP, TERM, then KILL after ``grace``); then whatever left
        the session is ended by marker; the exit is the holder's."""
        with contextlib.suppress(BackendError):
            await self._session.link.write(frame(Frame.KILL, struct.pack(">I", int(grace * 1000))))
        try:
            exit = await asyncio.wait_for(self.wait(), grace + 10)
        except TimeoutError:
            raise BackendError("the holder did not record the program's end after it was ended") from None
        await self._end_tree(grace)
        # Nothing is left to hold: the holder goes once its last output and the end are sent (its record
        # stays until ``release``).
        with contextlib.suppress(BackendError):
            await self._session.link.write(frame(Frame.QUIT))
        return exit

    async def detach(self) -> None:
        """Let go: the holder keeps the program (and its output since our last ack) for a later owner."""
        self._closed = True
        await self._session.link.close()

    async def release(self) -> None:
        """The exit is on record: the holder may go, and its directory (its own record) with it."""
        self._closed = True
        with contextlib.suppress(BackendError, OSError):
            await self._session.link.write(frame(Frame.QUIT))
        # Once the holder has gone (it sent us everything first), nothing is left of it.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._until_link_ends(), 5)
        await self._session.link.close()
        await self._forget()

    async def _until_link_ends(self) -> None:
        with contextlib.suppress(BackendError, OSError):
            while await self._session.next() is not None:
                pass
