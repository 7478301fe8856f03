"""Commands on pipes (``pty: false``): stdout and stderr kept apart, stdin that can be closed.

Such a command runs as ``tether-holder mux -- ARGV`` on the terminal a shell would have had (so every
backend, the holder, the worker's buffer, offsets and the record stay as they are): the mux runs ARGV on
pipes, with no terminal of its own, and speaks for it in lines of ASCII (holder/tether-holder.c, ``mux``)::

    O<out>,<err>,<n>:<base64>\\n    a piece of stdout    E<out>,<err>,<n>:<base64>\\n    a piece of stderr
    D<base64>\\n                    bytes for its stdin  C\\n                            close its stdin (EOF)

``<out>`` and ``<err>`` count each stream's bytes before the piece (of ``<n>`` bytes), so any whole line says
where it stands in both streams: a read that starts mid-stream (bytes lost before it, a buffer trimmed anywhere)
finds its place from the first whole line, and each stream has offsets of its own. A line whose bytes are not
``<n>`` (cut short, or a terminal's redraw of one), or that does not come after the one before it (a redraw
after an adoption repeats lines), is not a piece. The *merged* offset of a piece is
``out + err``: the order in which the mux read the pieces, the shared sequence of the two streams (exact
within each; between them as near as two pipes allow).
"""

from __future__ import annotations

import base64
import bisect
import itertools
import re
from dataclasses import dataclass
from enum import StrEnum

LINE = re.compile(
    rb"([OE])(\d{1,20}),(\d{1,20}),(\d{1,5}):((?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?)\r?"
)
LINE_BYTES = 4200  # the longest line the mux writes: a 3,072-byte piece in base64 and its head
NOT_STARTED = re.compile(rb"N((?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?)\r?")
INPUT_PIECE = 768  # bytes of input a line: 1,024 characters, well inside a cooked terminal's 4,095
CLOSE_INPUT = b"C\n"


class View(StrEnum):
    ALL = "all"  # both streams, in the order they came (offsets: the merged sequence)
    STDOUT = "stdout"
    STDERR = "stderr"


@dataclass(frozen=True, slots=True)
class Piece:
    at: int  # where its line starts in the encoded stream
    stream: View  # STDOUT or STDERR
    out: int  # stdout bytes before it
    err: int  # stderr bytes before it
    encoded: bytes

    @property
    def size(self) -> int:
        return len(self.encoded) * 3 // 4 - len(self.encoded) + len(self.encoded.rstrip(b"="))

    @property
    def data(self) -> bytes:
        return base64.b64decode(self.encoded)

    def before(self, view: View) -> int:
        """Where it starts in ``view``'s offsets."""
        return {View.STDOUT: self.out, View.STDERR: self.err}.get(view, self.out + self.err)

    def after(self, view: View) -> int:
        """Where ``view`` stands once this piece is counted."""
        return self.before(view) + (self.size if view in (View.ALL, self.stream) else 0)


def parse(encoded: bytes, origin: int, aligned: bool, reached: int = -1) -> tuple[list[Piece], int, int]:
    """The pieces in the whole lines of ``encoded`` (which starts at ``origin`` of the encoded stream), how many
    of its bytes they took (a last line not yet ended is left for the next read), and where they brought the
    merged sequence. Unless ``aligned`` (known to start a line), its first line may be the tail of one cut off:
    skipped (never guessed). Any other line (an echo, a message of the mux's own) is not a piece; nor is one
    that goes back before ``reached``."""
    found, at = [], 0
    if not aligned and (newline := encoded.find(b"\n")) >= 0 and not LINE.fullmatch(encoded, 0, newline):
        at = newline + 1  # (a line's tail cannot pass for a line: base64 has no "," or ":")
    while (end := encoded.find(b"\n", at)) >= 0:
        if match := LINE.fullmatch(encoded, at, end):
            kind, out, err, size, text = match.groups()
            piece = Piece(origin + at, View.STDOUT if kind == b"O" else View.STDERR, int(out), int(err), text)
            if piece.size == int(size) and piece.out + piece.err >= reached:
                found.append(piece)
                reached = piece.after(View.ALL)
        at = end + 1
    return found, at, reached


def pieces(encoded: bytes, origin: int) -> list[Piece]:
    """The pieces of ``encoded``, which starts at ``origin`` (a line's start when 0)."""
    return parse(encoded, origin, aligned=origin == 0)[0]


class Index:
    """The pieces of a growing stream whose front is let go of (a worker's buffer), each line parsed once."""

    def __init__(self):
        self.pieces: list[Piece] = []
        self.parsed_to = -1  # the encoded offset parsing goes on from (a line's start); -1: not yet begun
        self.reached = -1

    def update(self, since, start: int) -> list[Piece]:
        """``since(offset)`` answers (first, bytes, lost) from ``offset`` on; ``start`` is the first kept."""
        if self.parsed_to < start:  # new, or its front let go of past where parsing stood: from the start
            first, data, _ = since(start)
            self.pieces, taken, self.reached = parse(data, first, aligned=first == 0)
        else:
            first, data, _ = since(self.parsed_to)
            more, taken, self.reached = parse(data, first, aligned=True, reached=self.reached)
            self.pieces.extend(more)
        self.parsed_to = first + taken
        drop = bisect.bisect_left(self.pieces, start, key=lambda piece: piece.at)
        if drop:
            del self.pieces[:drop]
        return self.pieces


@dataclass(frozen=True, slots=True)
class Chunk:
    stream: View
    offset: int  # in its own stream
    seq: int  # in the merged sequence
    data: bytes


@dataclass(frozen=True, slots=True)
class ViewRead:
    data: bytes
    chunks: tuple[Chunk, ...]
    offset: int  # where data starts in the view's offsets
    next: int
    first_kept: int
    end: int
    lost: int


def first_and_end(found: list[Piece], view: View, whole: bool) -> tuple[int, int] | None:
    """The view's first kept offset and where it ends, from the pieces kept; ``whole``: the encoded stream is
    kept from its start. None when nothing says (no whole piece kept of a stream kept from later on)."""
    if not found:
        return (0, 0) if whole else None
    return (0 if whole else found[0].before(view)), found[-1].after(view)


def starting_at(found: list[Piece], view: View, since: int) -> Piece | None:
    """The first piece of ``view`` with bytes at or after ``since`` (the pieces' counts only grow: a bisection,
    on a worker's hot path)."""
    at = bisect.bisect_right(found, since, key=lambda piece: piece.after(view))
    return next((piece for piece in itertools.islice(found, at, None) if view in (View.ALL, piece.stream)), None)


def read(found: list[Piece], view: View, since: int, size: int, first: int, end: int) -> ViewRead:
    """At most ``size`` bytes of ``view`` from ``since``, out of ``found`` (the view's kept bytes start at
    ``first``). Bytes not there are ``lost``, said, never skipped in silence: before ``first``, and a piece
    missing between two (the read stops before it; the next one says it)."""
    offset = max(since, first)
    taken, chunks, room, at = [], [], size, offset
    for piece in found:
        if room <= 0:
            break
        if view is not View.ALL and piece.stream is not view:
            continue
        begin, stop = piece.before(view), piece.after(view)
        if stop <= at:
            continue
        if begin > at:  # a piece that is not there
            if taken:
                break
            offset = at = begin
        skip = at - begin
        data = piece.data[skip : skip + room]
        own = (piece.out if piece.stream is View.STDOUT else piece.err) + skip
        chunks.append(Chunk(piece.stream, own, piece.out + piece.err + skip, data))
        taken.append(data)
        room -= len(data)
        at += len(data)
    if not taken and offset < end:  # nothing kept up to where the view is known to end
        offset = at = end
    return ViewRead(b"".join(taken), tuple(chunks), offset, at, first, end, max(offset - since, 0))


def encode_input(data: bytes, close: bool = False) -> bytes:
    """``data`` for a command's stdin as the mux reads it (and its end, when ``close``)."""
    lines = [b"D" + base64.b64encode(data[at : at + INPUT_PIECE]) + b"\n" for at in range(0, len(data), INPUT_PIECE)]
    return b"".join(lines) + (CLOSE_INPUT if close else b"")


def not_started(encoded: bytes) -> str | None:
    """Why the program never ran, when the mux said so (its line ``N<base64>``), else None."""
    at = 0
    while (end := encoded.find(b"\n", at)) >= 0:
        if match := NOT_STARTED.fullmatch(encoded, at, end):
            return base64.b64decode(match.group(1)).decode("utf-8", "replace")
        at = end + 1
    return None
