r"""asciicast v3 (and v2 for older tools): the events of a recording as they are taken, kept and written.

No I/O here. ``EventLog`` takes a shell's output, input, resizes and markers as they happen and hands out
the records the owner worker stores in chunks; ``write_v3`` and ``v2_from_v3`` turn those chunks into a file
(https://docs.asciinema.org/manual/asciicast/v3/).

A chunk's records, one after another:

- ``O<unix_seconds> <length>\n`` and then that many bytes: a read of the shell's output, as it was read.
  Output is taken raw and made into text once, when the file is made: JSON-encoding every read as it came
  was the largest item of a busy worker's profile (docs/benchmarks.md).
- ``R\n``: the output before and after are not one stream (a hole, or another owner's stream), so a
  character left unfinished before it is dropped.
- ``[unix_seconds, code, data]\n``: any other event (input, resize, marker, exit), and output as chunks
  written before output was taken raw held it.
- ``# ...\n``: a comment, copied into the file.

Output is decoded as UTF-8 incrementally across reads and chunks, so a character split across two reads (or
two owners) is one character in the file and the file's output, encoded again, is the shell's output byte
for byte; bytes that are not UTF-8 become U+FFFD, as asciinema's own recorder does.
"""

from __future__ import annotations

import codecs
import itertools
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

TERM_TYPE = "xterm-256color"
UTF8 = codecs.getincrementaldecoder("utf-8")


def event_line(at: float, code: str, data: str) -> bytes:
    return json.dumps([round(at, 6), code, data], ensure_ascii=False).encode() + b"\n"


RESET = b"R\n"


@dataclass
class EventLog:
    """One recording's events as they are taken, up to a size bound (``limit``, bytes of records).

    ``end`` is the stream offset the recorded output runs to, in ``stream`` (see Recording.stream): output
    already recorded (a new owner replaying a holder's ring) is skipped, and a hole is said with a marker.
    """

    started: float  # Unix seconds
    limit: int
    grid: tuple[int, int] = (80, 24)  # the grid as last recorded
    stream: int = 0
    end: int = 0
    size: int = 0  # bytes of records taken so far (in earlier chunks too)
    output_bytes: int = 0
    truncated_at: int | None = None
    pending: list[bytes] = field(default_factory=list)
    pending_bytes: int = 0  # of ``pending``, kept as records come and go (asked at every output)
    new_markers: list[list] = field(default_factory=list)

    @property
    def cut(self) -> bool:
        return self.truncated_at is not None

    def _add(self, at: float, code: str, data: str, *, bounded: bool = True) -> bool:
        line = event_line(at, code, data)
        if bounded and self.size + len(line) > self.limit:
            return False
        self._pend(line)
        self.size += len(line)
        return True

    def _pend(self, line: bytes) -> None:
        self.pending.append(line)
        self.pending_bytes += len(line)

    def output(self, stream: int, offset: int, data: bytes, at: float) -> None:
        if self.cut:
            return
        if stream != self.stream:
            # Another owner's stream, counted from its own start (an adopted tmux shell): go on from there.
            self.stream, self.end = stream, offset
            self._pend(RESET)
        if offset + len(data) <= self.end:
            return  # recorded already
        if offset < self.end:
            data = data[self.end - offset :]
            offset = self.end
        elif offset > self.end:
            self._pend(RESET)
            self.marker(f"{offset - self.end} bytes of output were not recorded here", at)
            if self.cut:  # the hole's marker met the size bound: cut where the hole began
                return
        if not data:
            self.end = offset
            return
        head = b"O%.6f %d\n" % (at, len(data))
        if self.size + len(head) + len(data) > self.limit:
            self._cut_at(offset, at)
            return
        # As read (a bytearray is copied: its owner may reuse it); the header and the bytes are joined when
        # the chunk is taken, so a read is copied once here.
        self.pending += (head, data if type(data) is bytes else bytes(data))
        self.pending_bytes += len(head) + len(data)
        self.size += len(head) + len(data)
        self.end = offset + len(data)
        self.output_bytes += len(data)

    def _cut_at(self, offset: int, at: float) -> None:
        self.truncated_at = offset
        label = f"recording cut here: its size bound ({self.limit} bytes) was reached at output offset {offset}"
        self._pend(RESET)  # a character the output before the cut left unfinished is not written
        self._pend(f"# {label}; the session went on unrecorded\n".encode())
        self.marker(label, at, bounded=False)

    def input(self, data: bytes, at: float) -> None:
        if not self.cut and not self._add(at, "i", data.decode("utf-8", "replace")):
            self._cut_at(self.end, at)

    def resize(self, cols: int, rows: int, at: float) -> None:
        self.grid = (cols, rows)
        if not self.cut and not self._add(at, "r", f"{cols}x{rows}"):
            self._cut_at(self.end, at)

    def marker(self, label: str, at: float, *, bounded: bool = True) -> None:
        if self.cut and bounded:
            return
        if self._add(at, "m", label, bounded=bounded):
            self.new_markers.append([round(max(at - self.started, 0.0), 3), label])
        else:
            self._cut_at(self.end, at)

    def take(self) -> Taken:
        """The records and markers taken since the last call, and where the recording stands with them."""
        taken = Taken(
            b"".join(self.pending),
            self.new_markers,
            stream=self.stream,
            grid=self.grid,
            end=self.end,
            size=self.size,
            output_bytes=self.output_bytes,
            truncated_at=self.truncated_at,
        )
        self.pending, self.pending_bytes, self.new_markers = [], 0, []
        return taken


@dataclass(frozen=True)
class Taken:
    lines: bytes  # the records
    markers: list
    stream: int
    grid: tuple[int, int]
    end: int
    size: int
    output_bytes: int
    truncated_at: int | None


# --- files ---------------------------------------------------------------------------------------

Event = tuple[float, str, str]


def _records(data: bytes) -> Iterator[tuple[float, str, str | bytes] | bytes]:
    """A chunk's records as stored: (time, "O", raw bytes) for output taken raw, (time, code, text) for an
    event line, ``RESET``, or a comment line (bytes)."""
    at, size = 0, len(data)
    while at < size:
        newline = data.find(b"\n", at)
        if newline < 0:
            newline = size
        line = data[at:newline]
        at = newline + 1
        if line.startswith(b"O"):
            when, length = line[1:].split(b" ")
            body, at = data[at : at + int(length)], at + int(length)
            yield float(when), "O", body
        elif line == b"R":
            yield RESET
        elif line.startswith(b"#"):
            yield line + b"\n"
        elif line:
            when, code, text = json.loads(line)
            yield float(when), code, text


def events(chunks: Iterable[bytes], *, final: bool = False) -> Iterator[Event | bytes]:
    """The events of stored chunks, in order, output made text (UTF-8, decoded across reads and chunks);
    comment lines as bytes. ``final``: the output has ended, so a character it left unfinished is U+FFFD."""
    decoder, last = UTF8("replace"), 0.0
    for data in chunks:
        for record in _records(data):
            if type(record) is bytes:
                if record == RESET:
                    decoder.reset()
                else:
                    yield record
            else:
                when, code, text = record
                last = when
                if code != "O":
                    yield record
                elif text := decoder.decode(text):
                    yield when, "o", text
    if final and (text := decoder.decode(b"", final=True)):
        yield last, "o", text


def parse_lines(data: bytes) -> Iterator[Event]:
    """The events of stored records, with their absolute times (comments left out)."""
    for event in events([data]):
        if type(event) is not bytes:
            yield event


def write_v3(header: dict, chunks: Iterable[bytes], started: float, closing: bytes = b"") -> Iterator[bytes]:
    """The file, a line at a time: the header, then each event with the time since the one before it (never
    negative: the owners that took a recording's events may have had slightly different clocks). ``closing``:
    how the shell ended (its output has ended with it); without it, a recording still being made."""
    yield json.dumps({"version": 3, **header}, ensure_ascii=False).encode() + b"\n"
    last = started
    for event in itertools.chain(events(chunks, final=bool(closing)), events([closing])):
        if type(event) is bytes:
            yield event
            continue
        at, code, text = event
        yield json.dumps([round(max(at - last, 0.0), 6), code, text], ensure_ascii=False).encode() + b"\n"
        last = max(last, at)


def v2_from_v3(lines: Iterable[bytes]) -> Iterator[bytes]:
    """asciicast v2 from a v3 file's lines: absolute times, ``width``/``height``, the exit as a marker (v2 has
    no exit event; worded apart from a typed ``exit N`` command's marker), comments dropped."""
    elapsed = 0.0
    for number, line in enumerate(lines):
        if number == 0:
            header = json.loads(line)
            term = header.pop("term", {})
            header.pop("version", None)
            v2 = {"version": 2, "width": term.get("cols", 80), "height": term.get("rows", 24), **header}
            v2.setdefault("env", {})["TERM"] = term.get("type", TERM_TYPE)
            yield json.dumps(v2, ensure_ascii=False).encode() + b"\n"
            continue
        if not line.strip() or line.startswith(b"#"):
            continue
        interval, code, text = json.loads(line)
        elapsed += interval
        if code == "x":
            code, text = "m", f"the shell exited with status {text}"
        yield json.dumps([round(elapsed, 6), code, text], ensure_ascii=False).encode() + b"\n"


def output_of(lines: Iterable[bytes]) -> bytes:
    """Every output event's data, encoded again: the shell's output as the file has it."""
    out = bytearray()
    for number, line in enumerate(lines):
        if number and line.strip() and not line.startswith(b"#"):
            _, code, text = json.loads(line)
            if code == "o":
                out += text.encode()
    return bytes(out)
