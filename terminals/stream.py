"""One viewer's side of an owner's output stream, with no I/O: offsets, dedupe, gaps, acks and input numbers.

The consumer feeds it what arrives (the browser's attach and acks, the worker's messages) and does what it
answers: send these bytes, ask for a resend from this offset, forward this ack. Every rule that keeps the
browser's stream gap-free and free of repeats lives here, so it is tested without a socket.

The channel layer delivers at least once (channels-redis restores a message whose receive was cut short):
an attach is numbered so a repeated ``attached`` cannot rewind the stream, input is numbered so the worker
never writes a key twice, and output is placed by offset so a repeat is dropped and a hole is noticed.
"""

from __future__ import annotations

from dataclasses import dataclass

from terminals.protocol import Attached, Gap, Output

ACK_BATCH_BYTES = 128 * 1024  # an ack freeing this much of the flow window goes to the worker at once
# An observer never holds back the shell, so nothing upstream waits for its browser: output it has not
# rendered past this much is dropped here, and asked for again by offset once it has caught up.
OBSERVER_WINDOW_BYTES = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Deliver:
    """Send ``data`` to the browser (the part of a chunk it has not had)."""

    data: bytes


@dataclass(frozen=True, slots=True)
class FetchFrom:
    """A chunk went missing between worker and here: ask the worker to send again from ``since``."""

    since: int


class ViewerStream:
    """``window`` (an observer's): how far output may run ahead of the browser's acks before it is dropped."""

    def __init__(self, window: int | None = None) -> None:
        self.window = window
        self.behind = False  # an observer's browser fell a window behind: output waits for it to catch up
        self.expected = 0  # the next output offset the browser should receive
        self.generation: int | None = None  # the shell (generation) those offsets belong to
        self.epoch: int | None = None  # the owner's stream (lease token) those offsets belong to
        self.attached = False  # the owner confirmed this viewer; until then output is left to the replay
        self.attach_id = 0
        self.input_seq = 0
        self.ack_pending = 0  # the browser's latest ack
        self.ack_forwarded = 0  # the last ack passed on to the worker

    # --- attaching ---------------------------------------------------------------------------

    def want(self, since: int, generation: int | None, epoch: int | None) -> None:
        """The browser asks to (re)join from ``since`` of ``generation`` under ``epoch``."""
        self.expected, self.generation, self.epoch = since, generation, epoch
        self.leave()

    def next_attach(self, generation: int) -> tuple[int, int]:
        """Number a new attach to the owner of ``generation``: (attach id, offset to replay from). Offsets of
        another generation mean nothing in this one: it replays from its start."""
        if generation != self.generation:
            self.expected = 0
        self.attach_id += 1
        return self.attach_id, self.expected

    def confirmed(self, message: Attached) -> bool:
        """The owner's answer to an attach. False for a repeat, or for an attach since replaced."""
        if self.attached or message.attach != self.attach_id:
            return False
        self.attached = True
        self.behind = False
        self.expected, self.generation, self.epoch = message.offset, message.generation, message.epoch
        self.ack_pending = self.ack_forwarded = message.offset  # the worker's flow window starts here
        return True

    def leave(self) -> None:
        """Attached no more (superseded, ended, or about to attach again). An answer to an attach sent
        before this moment is stale from now on, even before the next attach is numbered."""
        self.attached = False
        self.attach_id += 1

    def next_generation(self) -> None:
        """A fresh shell replaced the one this viewer saw: the next attach starts it from its beginning."""
        self.leave()
        self.generation = None
        self.expected = 0

    def current(self, epoch: int | None) -> bool:
        """Whether a message belongs to the stream this viewer is on (not to an owner it has left behind)."""
        return epoch == self.epoch

    # --- output ------------------------------------------------------------------------------

    def output(self, message: Output) -> Deliver | FetchFrom | None:
        if not self.current(message.epoch) or not self.attached:
            return None  # a dead owner's, or a stream not (re)joined yet: the attach replays it
        end = message.offset + len(message.data)
        if end <= self.expected or self.behind:
            return None  # a repeat, or an observer's browser that is not keeping up (caught_up asks again)
        if message.offset > self.expected:
            return FetchFrom(self.expected)
        if self.window is not None and self.expected - self.ack_pending >= self.window:
            self.behind = True
            return None
        data = message.data[self.expected - message.offset :]
        self.expected = end
        return Deliver(data)

    def gap(self, message: Gap) -> bool:
        """Bytes past the owner's buffer were lost: whether to tell the browser (a stream never rewinds)."""
        if not self.current(message.epoch) or not self.attached or message.offset <= self.expected:
            return False
        self.expected = message.offset
        return True

    def missing(self, end: int) -> int | None:
        """After a replay that should run to ``end``: the offset to fetch again from, if it fell short."""
        return self.expected if self.attached and self.expected < end else None

    # --- acks and input ----------------------------------------------------------------------

    def ack(self, offset: int) -> bool | None:
        """The browser rendered up to ``offset``. True: forward now (it frees a good part of the window);
        False: forward a moment later with whatever follows; None: nothing to forward."""
        if not self.attached:
            return None
        self.ack_pending = max(self.ack_pending, offset)
        if self.ack_pending <= self.ack_forwarded:
            return None
        return self.ack_pending - self.ack_forwarded >= ACK_BATCH_BYTES

    def caught_up(self, offset: int) -> FetchFrom | None:
        """An observer's browser rendered up to ``offset`` (its acks stay here: it holds nothing back). Once
        it is well inside its window again after falling behind, what it missed is asked for again."""
        if not self.attached:
            return None
        self.ack_pending = max(self.ack_pending, min(offset, self.expected))
        if self.behind and self.expected - self.ack_pending <= (self.window or 0) // 2:
            self.behind = False
            return FetchFrom(self.expected)
        return None

    def take_ack(self) -> int | None:
        """The ack to forward now, if there is a new one."""
        if not self.attached or self.ack_pending <= self.ack_forwarded:
            return None
        self.ack_forwarded = self.ack_pending
        return self.ack_forwarded

    def next_input(self) -> int:
        self.input_seq += 1
        return self.input_seq
