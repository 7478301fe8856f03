"""What a shell's terminal in the worker's emulator is sent (``ShellScreen``'s part that counts frames): long
plain runs cut short where the emulator has said its terminal lets them be, and held back, not sent at all, until
the emulator is asked, other output comes or the grid changes; the screen left with the session holder meanwhile
made here from the emulator's last one and what is held (plain.py, docs/protocol.md)."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from terminals.screen.plain import cut_short, plain_escapes, unfinished

GRID = struct.Struct(">HH")  # a kept screen's grid, before it
KEEP_MOST = 64 * 1024 - 8  # the most a session holder keeps (its frame of output)
HELD_MOST = 256 * 1024  # plain output held back from the emulator (cut short) above which it is sent
ERASED = b"\x1b[2J\x1b[3J\x1b[H"  # the screen and the scrollback erased, the cursor home


@dataclass(eq=False, kw_only=True)
class Frames:
    """The frames a shell's terminal in the emulator is sent. A base of ``ShellScreen``, whose ``screens``,
    ``number``, ``cols``, ``rows`` and ``opened`` it uses."""

    # Frames sent that change its terminal (O, D, R). Every output frame after ``chain`` was plain (plain.py), each
    # going on from what the last left unfinished (``carries``: frame -> those bytes); once the emulator has said
    # its terminal let a plain run be cut short after one of them (its ``A``; ``known``), so it does after the last,
    # and long plain runs are cut short here.
    frames: int = 0
    chain: int = 0
    carries: dict[int, bytes] = field(default_factory=lambda: {0: b""})
    known: bool = False
    cut: int = 0  # bytes of output not sent to the emulator (cut from long plain runs)
    # Plain output after the last frame sent, held back (cut short) while its terminal is known to let it be:
    # sent when the emulator is asked, or output that is not plain comes, or the grid changes. Until then the
    # screen left with the session holder is the emulator's last one (``base``: the frame count it was at, its
    # bytes) followed by what is held, cut to the screen's lines: a `cat` costs the emulator nothing.
    held: bytes = b""
    base: tuple[int, bytes] | None = None

    def _frame(self, kind: bytes, payload: bytes) -> bool:
        self.frames += 1
        return self.screens._send(kind, self.number, payload)

    def _unchained(self) -> None:
        """After a frame that is not plain output: nothing is known of its terminal until the emulator says."""
        self.chain, self.carries, self.known = self.frames, {self.frames: b""}, False

    def _write(self, data: bytes) -> None:
        """Output for the emulator: held back while it is plain and its terminal known to let it be, a long run
        cut short; else sent (with what was held before it)."""
        carry = self.carries[self.frames]
        whole = b"".join((carry, self.held, data)) if carry or self.held else data
        escapes = plain_escapes(whole)
        left = unfinished(whole) if escapes is not None else -1
        if self.known and left >= 0:
            short = cut_short(whole, self.screens.scrollback + 2 * self.rows + 1, escapes)
            if short is not None:
                self.cut += len(whole) - len(short)
                whole = short  # (the cut keeps the first line whole: carry is its start)
            self.held = whole[len(carry) :]
            if len(self.held) > HELD_MOST:
                self.flush()
            return
        self.held = b""
        self._send(whole, len(carry), left)

    def _send(self, whole: bytes, carried: int, left: int) -> None:
        """A D frame of ``whole`` but the ``carried`` bytes at its start (sent with the last frame), ``left`` bytes
        of which are unfinished (-1: not plain)."""
        self._frame(b"D", whole[carried:])
        if left < 0:
            self._unchained()
            return
        if self.known:
            self.carries.clear()
        self.carries[self.frames] = whole[len(whole) - left :] if left else b""

    def flush(self) -> None:
        """What is held back, to the emulator (before it is asked, or anything else is sent)."""
        if not self.held or not self.opened:
            return
        carry = self.carries[self.frames]
        whole, self.held = carry + self.held, b""
        self._send(whole, len(carry), unfinished(whole))

    def _held_screen(self) -> bytes | None:
        """The screen at ``fed`` without asking the emulator: its last screen (``base``) and what was held since,
        cut to the lines a screen needs (as feed.cjs would cut them); None when there is no such screen."""
        if self.base is None or self.base[0] != self.frames or self.pending:
            return None
        data = self.held
        # (the screen and its scrollback erased where the cut is, the last lines written from the top: what the
        # emulator's last screen and the run's first line would leave above them did not come just before them; the
        # last lines alone fill the screen, and those that scroll off are the scrollback)
        if self.held and (short := cut_short(self.held, 2 * self.rows + 1, between=ERASED)) is not None:
            data = short
        screen = b"".join((GRID.pack(self.cols, self.rows), self.base[1], data))
        return screen if len(screen) <= KEEP_MOST else None

    def acked(self, frames: int, plain: bool) -> None:
        """The emulator's word after its ``frames``-th frame: whether its terminal lets a plain run be cut short
        (never in the middle of a sequence: only a frame that left nothing unfinished is taken at its word)."""
        if frames < self.chain:
            return
        carry = self.carries.get(frames)
        for older in [frame for frame in self.carries if frame < frames]:  # (never to be said of again)
            del self.carries[older]
        if carry != b"":
            return
        if plain:
            self.known = True
            self.carries = {self.frames: self.carries[self.frames]}
        elif self.known:  # not what was sent said: the emulator is believed
            self._unchained()
