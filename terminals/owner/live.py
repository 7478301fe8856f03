"""One live process held by the owner worker: its output pump, buffer, viewer and flow control.

The pump reads the process only while the current viewer's unacknowledged
output is under the high watermark (or while nobody views: output then goes
only to the bounded buffer, so a detached session keeps running).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from enum import IntEnum

from executions import pipes
from recordings.take import Take
from terminals.backends.base import BackendError, Exit, Process
from terminals.lifetimes import Limits
from terminals.marks import MarkReader
from terminals.owner.buffer import OutputBuffer
from terminals.owner.config import WorkerConfig
from terminals.protocol import Reason
from terminals.screen import ShellScreen

log = logging.getLogger(__name__)

OUTPUT_MESSAGE_BYTES = 64 * 1024  # cap on one channel message's payload


GRIDS_KEPT = 256  # grid changes remembered (a last screen past the oldest is not exact)


@dataclass
class Viewer:
    channel: str
    viewer_id: str
    attach_id: int | None = None
    input_seq: int = 0  # the last input message written; a repeated delivery is not written again


@dataclass
class Observer:
    """A read-only viewer beside the writer: sees the stream, never types, never changes the grid, and never
    holds back the shell (its consumer drops what its browser cannot take, then asks again by offset)."""

    channel: str
    viewer_id: str
    name: str  # who watches
    via: str  # how: "share link", "staff", or "" (the shell's own user, from another window)
    attach_id: int | None = None
    seen: float = field(default_factory=time.monotonic)  # its last attach or keep-alive

    def said(self) -> dict:
        return {"name": self.name, "via": self.via}


MIN_WINDOW_BYTES = 4096  # the least flow window a streaming session is given, however many there are


@dataclass
class FlowBudget:
    """The worker's output in flight to all its viewers at once (TETHER_FLOW_WORKER_BYTES), shared out
    among the sessions that have output in flight: with a hundred sessions streaming, each gets a
    hundredth, so a keystroke's echo waits behind a bounded amount of other sessions' output."""

    total: int
    high: int  # the most a session is given (TETHER_FLOW_HIGH_BYTES)
    streaming: set[int] = field(default_factory=set)  # execution pks with unacknowledged output

    def window(self) -> int:
        share = self.total // max(len(self.streaming), 1)
        return max(MIN_WINDOW_BYTES, min(self.high, share))


class Phase(IntEnum):
    """A held process's life as its owner sees it: one state that only moves forward."""

    HELD = 1  # supervised: output pumped, exit awaited
    CLOSING = 2  # being ended on purpose (``ended_for`` says why); reads on to EOF
    LET_GO = 3  # observation handed back (lease lost, or left for a later owner); nothing more is written


@dataclass
class LiveProcess:
    execution_pk: int
    token: int
    kind: str
    process: Process
    config: WorkerConfig  # its worker's
    session_id: str | None = None
    generation: int = 0
    buffer: OutputBuffer = field(init=False)
    # A command on pipes: its buffer's lines parsed as they come (executions.pipes), once the API reads it.
    pipes_index: pipes.Index | None = None
    viewer: Viewer | None = None
    flow_open: asyncio.Event = field(default_factory=asyncio.Event)
    exit: Exit | None = None
    lost_observation: str = ""  # why no trustworthy exit could be had
    pump_task: asyncio.Task | None = None
    phase: Phase = Phase.HELD
    ended_for: Reason | None = None  # why it is being ended, once CLOSING
    handle_backend: str = ""
    limits: Limits = field(default_factory=Limits)
    started: float = field(default_factory=time.monotonic)
    last_activity: float = field(default_factory=time.monotonic)
    warned: str = ""  # the reason the current viewer was last warned about
    handled_request: str = ""
    send_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    acked: int = 0  # offset the last viewer confirmed rendering; kept while it is away
    viewer_gone_at: float | None = None
    # An adopted command (no shell's page to come back): the window is kept at the holder's origin for its API
    # reader to come back; the first reader back holds it at its own offset from then on.
    kept_for_return: bool = False
    budget: FlowBudget | None = None  # the worker's, shared with its other sessions
    # Bytes at the buffer's start that are the screen as adopted: drawn for the grid it had then.
    adopted_screen: int = 0
    adopted: bool = False  # taken over from a dead or stopped owner
    # The offset from which the buffer held every byte its screen was drawn from (a fresh shell's first byte, a
    # redraw of the whole screen as adopted): while its start is still there, its last screen is exact.
    whole_from: int | None = None
    # (offset, cols, rows): the grid output is drawn for from each offset on, the latest GRIDS_KEPT (the last
    # screen is drawn with each at its place)
    grids: list[tuple[int, int, int]] = field(default_factory=list)
    grid: tuple[int, int] = (80, 24)  # the writer's grid (observers draw this one)
    writer_name: str = ""  # who wrote last (a change of hands is marked in the recording)
    observers: dict[str, Observer] = field(default_factory=dict)  # viewer id -> observer
    recording: Take | None = None  # its recording as this owner takes it (recordings.recorder)
    marks: MarkReader | None = None  # the shell's command marks, when it was started with the integration
    marks_seen: bool = False
    # Its screen at the buffer's start, kept by the worker's emulator (a shell's, where tmux keeps none).
    screen: ShellScreen | None = None
    # (API client, seq) of the API input written lately: a repeated delivery is not written twice.
    api_written: dict[tuple[str, int], bool] = field(default_factory=dict)
    prompt_shown_at: float | None = None  # when a POSIX shell's last prompt ended (its B mark), our clock
    # API clients reading the output by offset: client -> (the offset it asked from, when, our clock). Like a
    # viewer that just went away, each holds the output back for the reconnect grace after its last read.
    readers: dict[str, tuple[int, float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.buffer = OutputBuffer(self.config.buffer_bytes)
        self.flow_open.set()

    def advance(self, to: Phase) -> bool:
        """Move on to ``to``; False (and nothing changes) if the process is there or past it already."""
        if to <= self.phase:
            return False
        self.phase = to
        return True

    @property
    def closing(self) -> bool:
        """Being ended on purpose, or no longer ours to act on: no input, resize or new viewer."""
        return self.phase >= Phase.CLOSING

    def touch(self) -> None:
        """Someone is here: input, a keep-alive or an attach resets the idle clock."""
        self.last_activity = time.monotonic()
        self.warned = ""

    # --- flow control ----------------------------------------------------------------------

    def in_flight(self) -> int:
        return self.buffer.end - self.acked

    def update_flow(self) -> None:
        """Pause reading above the high watermark of unacknowledged output; resume below the low one.

        A viewer that just went away keeps its window for the reconnect grace period, so a
        quick reconnect resumes with no gap; after that the session runs free and the bounded
        buffer keeps only the tail (a reconnect is then told how much was lost).
        """
        in_flight = self.buffer.end - held_at if (held_at := self._held_back_at()) is not None else 0
        high, low = self.config.flow_high_bytes, self.config.flow_low_bytes
        if self.budget is not None:
            if in_flight > 0 and self.viewer is not None and not self.closing:  # in the shared pipes now
                self.budget.streaming.add(self.execution_pk)
            else:
                self.budget.streaming.discard(self.execution_pk)
            high = self.budget.window()
            low = min(low, high // 3)
        if self.closing:
            # Ending on purpose: read on to EOF, whoever is (not) acknowledging, so the supervisor sees the
            # end; a viewer that has gone acknowledges nothing, and a closed window would wait for it.
            self.flow_open.set()
        elif held_at is None:
            self.flow_open.set()
        elif in_flight >= high:
            self.flow_open.clear()
        elif in_flight <= low:
            self.flow_open.set()

    def _held_back_at(self) -> int | None:
        """The offset output waits at: the least of the writer's acknowledgement (while it views, or for the
        grace after it left) and the offsets API readers asked from within the grace; None: it runs free."""
        now, grace = time.monotonic(), self.config.reconnect_grace_seconds
        self.readers = {client: read for client, read in self.readers.items() if now - read[1] < grace}
        held = [offset for offset, _ in self.readers.values()]
        if self.viewer is not None or (self.viewer_gone_at is not None and now - self.viewer_gone_at < grace):
            held.append(self.acked)
        return min(held) if held else None

    def unread_from(self) -> int | None:
        """The least offset an API reader asked from within the grace (what it has yet to read starts there)."""
        self._held_back_at()  # forgets the readers past the grace
        return min((offset for offset, _ in self.readers.values()), default=None)

    def read_by(self, client: str, since: int) -> None:
        """An API client read from ``since``: it has what came before, and holds back what comes after."""
        self.readers[client] = (max(self.buffer.start, min(since, self.buffer.end)), time.monotonic())
        if self.kept_for_return and self.viewer is None:
            # The adoption's hold was for whoever came back, and one has: from now on the output waits at its
            # offset, not at the origin it has read past (which held the stream for the whole grace: 60 s).
            self.kept_for_return, self.viewer_gone_at = False, None
        self.update_flow()

    def forget_flow(self) -> None:
        """No longer held: its share of the worker's budget goes back to the others."""
        if self.budget is not None:
            self.budget.streaming.discard(self.execution_pk)

    def ack(self, viewer_id: str, offset: int) -> None:
        if self.viewer and self.viewer.viewer_id == viewer_id:
            # An ack can never move backwards or past what was produced.
            self.acked = max(self.acked, min(offset, self.buffer.end))
            self.update_flow()

    def viewer_left(self) -> None:
        self.viewer, self.kept_for_return = None, False  # a window's own grace from now on
        self.viewer_gone_at = time.monotonic()
        self.update_flow()

    # --- reading ---------------------------------------------------------------------------

    async def pump(self, deliver) -> None:
        """Read until the output ends, handing each chunk to ``deliver(offset, data)``."""
        try:
            while True:
                await self.flow_open.wait()
                chunk = await self.process.read()
                if not chunk:
                    break
                if self.screen is not None and self.buffer.evicts(len(chunk)):
                    await self.screen.ready()  # the buffer lets go of bytes, into the screen's emulator
                # Appending and sending under one lock keeps every viewer's stream in offset order:
                # an attach replays from the buffer under the same lock, so no chunk overtakes it.
                async with self.send_lock:
                    offset = self.buffer.append(chunk)
                    self.update_flow()
                    await deliver(offset, chunk)
        except BackendError as error:
            self.lost_observation = f"output stream failed: {error}"
            log.warning("execution %s: %s", self.execution_pk, self.lost_observation)

    async def observe_exit(self, timeout: float = 30.0) -> Exit | None:
        """The trustworthy exit, or None with ``lost_observation`` saying why there is none."""
        try:
            self.exit = await asyncio.wait_for(self.process.wait(), timeout)
        except (BackendError, TimeoutError) as error:
            self.lost_observation = self.lost_observation or f"no exit could be observed: {error!r}"
            return None
        return self.exit
