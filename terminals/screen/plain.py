"""Long runs of plain output cut short in the worker, before they cross to the emulator: the same cut feed.cjs makes
on its side (only up to the first line feed, the colour changes, then the last lines, as many as the screen and its
scrollback hold and the screen's height more), found here with a scan in C (plain.c; Python's bytes methods where
it is not built) so that most of a `cat` of a large file is neither piped to the emulator nor looked at there.

The cut is exact only where the terminal is on its normal screen with no region, origin and insert mode off, the
parser between sequences and no character half read (feed.cjs's ``plain``): the emulator says so after each frame
(``A``), and output that is plain text keeps it so, but for a colour change or character it ends in the middle of,
which the next output ends (``ShellScreen`` counts on both, and cuts the next output with those bytes before it).
tests/screens/test_plain_cut.py fuzzes it against writing every byte.
"""

from __future__ import annotations

import ctypes
import logging
import re
from pathlib import Path

log = logging.getLogger(__name__)

LONG = 4096  # shorter output is sent whole (as feed.cjs writes it whole)
UNFINISHED_MOST = 256  # the longest unfinished colour change carried on to the next piece

# Printable bytes (UTF-8's included), CR, LF, tab and backspace: what is left of output once these are taken out
# must be escapes only, each beginning a colour change (SGR), and no C1 control is written as UTF-8.
TEXT = bytes(b for b in range(256) if (b >= 0x20 and b != 0x7F) or b in b"\r\n\t\b")
# A colour change's parameters: taken out, every escape of plain output reads ESC [ m.
PARAMETERS = b"0123456789;:"
C1 = re.compile(rb"\xc2[\x80-\x9f]")
SGR = re.compile(rb"\x1b\[[0-9;:]*m")
RESETS = (b"\x1b[m", b"\x1b[0m", b"\x1b[0;")


LIBRARY = Path(__file__).resolve().parents[2] / "build" / "libtether-plain.so"  # plain.c, built by `make holder`


def _native():
    """plain.c's scan (a sixth of the time of python_escapes' on coloured text), or None without the library."""
    try:
        scan = ctypes.CDLL(str(LIBRARY)).tether_plain_escapes
    except (OSError, AttributeError) as error:
        log.warning("output is scanned for screens in Python, slower (%s: %s; `make holder` builds it)", LIBRARY, error)
        return None
    scan.restype, scan.argtypes = ctypes.c_long, [ctypes.c_char_p, ctypes.c_size_t]
    return scan


NATIVE = _native()


def plain_escapes(data: bytes) -> int | None:
    """How many colour changes ``data`` has when it is only text and colour changes (a sequence cut at the end
    counts: it goes on in what follows); None when it has anything else."""
    if NATIVE is None:
        return python_escapes(data)
    found = NATIVE(data, len(data))
    return None if found < 0 else found


def python_escapes(data: bytes) -> int | None:
    """``plain_escapes`` with Python's scans of the bytes (where plain.c's library is not built)."""
    escapes = len(rest := data.translate(None, TEXT))
    if rest.count(b"\x1b") != escapes:
        return None
    if escapes:
        # Each escape must begin ESC [ (ESC 7 before a "[" would pass what follows), and without the parameters
        # read ESC [ m (a private marker, an intermediate or another final byte would not); the last may be cut
        # short by the end.
        introduced = data.count(b"\x1b[")
        if introduced != escapes and not (introduced == escapes - 1 and data.endswith(b"\x1b")):
            return None
        bare = data.translate(None, PARAMETERS)
        found = bare.count(b"\x1b[m")
        if found != escapes and not (found == escapes - 1 and bare.endswith((b"\x1b[", b"\x1b"))):
            return None
    if b"\xc2" in data and C1.search(data):
        return None
    return escapes


def unfinished(data: bytes) -> int:
    """How many bytes at the end of ``data`` (plain: ``plain_escapes``) begin a colour change or a UTF-8 character not
    yet ended (0: none, -1: not known, as after bytes that are not UTF-8). A terminal where a plain run may be cut
    short is so after ``data`` but for those bytes, which the next output ends."""
    escape = data.rfind(b"\x1b")
    if escape >= 0 and data.find(b"m", escape) < 0:
        # (a colour change longer than any a program writes is not carried on: rescanned with every piece after
        # it, an endless one would cost the worker more each time)
        return len(data) - escape if len(data) - escape <= UNFINISHED_MOST else -1
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte < 0x80:
            return 0 if back == 1 else -1
        if byte >= 0xC0:  # the last character's first byte: it takes 2, 3 or 4
            need = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            if not 0xC2 <= byte <= 0xF4 or back > need:
                return -1
            return 0 if back == need else back
    return 0 if not data else -1


def cut_short(data: bytes, keep: int, escapes: int = 1, between: bytes = b"") -> bytes | None:
    """``data`` (plain, with ``escapes`` colour changes: ``plain_escapes``) as feed.cjs would write it: up to and
    with its first line feed, the colour changes of what is left out (from the last that resets the pen), a CR,
    then from the start of the line after the CR LF that has ``keep`` more line feeds after it (``between`` before
    that line). None when it is too short to cut."""
    if len(data) <= LONG:
        return None
    at = len(data)
    for _ in range(keep + 1):
        if (at := data.rfind(b"\n", 0, at)) < 0:
            return None
    first = data.find(b"\n")
    if not (first < at and data[at - 1] == 0x0D):
        return None
    colours = b""
    if escapes and data.rfind(b"\x1b", first + 1, at) >= 0:
        colours = b"".join(SGR.findall(data, _last_reset(data, first + 1, at), at))
    return b"".join((data[: first + 1], colours, b"\r", between, data[at + 1 :]))


def _last_reset(data: bytes, start: int, end: int) -> int:
    """Where the last colour change that resets the pen in ``data[start:end]`` begins (``start``: none), looked
    for from the end in growing windows (output that changes colour resets it often)."""
    window = 4096
    while True:
        begin = max(start, end - window)
        found = max(data.rfind(reset, begin, end) for reset in RESETS)
        if found >= 0 or begin == start:
            return max(found, start)
        window *= 8
