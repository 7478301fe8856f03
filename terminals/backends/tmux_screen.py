"""A tmux pane's screen as it is now, and the bytes that draw it on a blank terminal (xterm.js, the page's).

The screen is more than its text: a program in the alternate screen (less, vi, top) has the primary one kept
under it, and it has set modes the terminal must keep (mouse reporting and its encoding, application cursor
keys and keypad, auto-wrap, insert, origin, a scroll region, a hidden cursor, a title). tmux knows each of
them (``PANE_FORMAT``); ``Snapshot.render`` redraws the primary screen, switches to the alternate one where
the program is, draws it, and sets every mode as the pane has it, so the program's next bytes (and its exit
from the alternate screen) land as they would have on a terminal that saw everything.

tmux 3.3a says nothing of bracketed paste or focus reporting (no format tells them): the owner reads every byte
the pane writes (control mode's ``%output`` is the program's own bytes), so ``ModeWatch`` follows the program's
DECSET/DECRST 2004 and 1004 there, and the owner keeps them with the session in tmux (``@tether_paste``,
``@tether_focus``, 0.2 s after a change at most), where an owner that adopts the session after a kill finds them.
What a program sets while no owner reads it (between an owner's death and the adoption), or in the last 0.2 s
before a kill, is not seen: the last modes an owner kept are restored.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

# One line, "|"-separated, the title last (it may hold a "|"). A pane's title is the host's name until its
# program sets one: that default is said as "".
PANE_FIELDS = (
    "pane_id",
    "@tether_marker",
    "cursor_x",
    "cursor_y",
    "pane_width",
    "pane_height",
    "alternate_on",
    "alternate_saved_x",
    "alternate_saved_y",
    "keypad_cursor_flag",
    "keypad_flag",
    "mouse_standard_flag",
    "mouse_button_flag",
    "mouse_all_flag",
    "mouse_sgr_flag",
    "mouse_utf8_flag",
    "wrap_flag",
    "insert_flag",
    "origin_flag",
    "cursor_flag",
    "scroll_region_upper",
    "scroll_region_lower",
    "@tether_paste",  # what ModeWatch saw: "1" or "0" (unset: "")
    "@tether_focus",
)
CAPTURE = ("capture-pane", "-p", "-e", "-J")  # the visible screen with its SGR escapes, wrapped lines joined
PANE_FORMAT = "|".join(f"#{{{name}}}" for name in PANE_FIELDS) + "|#{?#{==:#{pane_title},#{host}},,#{pane_title}}"


@dataclass(frozen=True)
class Modes:
    """What a program set of the terminal's behaviour, as tmux keeps it for the pane."""

    cursor_keys: bool = False  # DECCKM: application cursor keys
    keypad: bool = False  # DECKPAM: application keypad
    mouse: int = 0  # 1000 (clicks), 1002 (and drags), 1003 (any motion); 0: none
    mouse_sgr: bool = False  # 1006
    mouse_utf8: bool = False  # 1005
    wrap: bool = True  # DECAWM
    insert: bool = False  # IRM
    origin: bool = False  # DECOM
    cursor_visible: bool = True  # DECTCEM
    region: tuple[int, int] | None = None  # the scroll region (top, bottom), 0-based; None: the whole screen
    title: str = ""
    paste: bool = False  # 2004: bracketed paste (ModeWatch, not tmux)
    focus: bool = False  # 1004: focus events (ModeWatch, not tmux)

    def render(self, cursor_x: int, cursor_y: int) -> bytes:
        """The modes set on a terminal whose modes are the defaults, ending with the cursor where it is."""
        out = []
        if self.title:
            out.append(f"\x1b]2;{self.title}\x07")
        if self.region is not None:
            out.append(f"\x1b[{self.region[0] + 1};{self.region[1] + 1}r")
        top = 0
        if self.origin:
            out.append("\x1b[?6h")  # cursor positions count from the region's top from here on
            top = self.region[0] if self.region else 0
        out.append(f"\x1b[{cursor_y - top + 1};{cursor_x + 1}H")
        out.append("\x1b[?1h" if self.cursor_keys else "")
        out.append("\x1b=" if self.keypad else "")
        out.append(f"\x1b[?{self.mouse}h" if self.mouse else "")
        out.append("\x1b[?1006h" if self.mouse_sgr else "")
        out.append("\x1b[?1005h" if self.mouse_utf8 else "")
        out.append("" if self.wrap else "\x1b[?7l")
        out.append("\x1b[4h" if self.insert else "")
        out.append("" if self.cursor_visible else "\x1b[?25l")
        out.append("\x1b[?2004h" if self.paste else "")
        out.append("\x1b[?1004h" if self.focus else "")
        return "".join(out).encode()


@dataclass(frozen=True)
class Snapshot:
    screen: bytes  # capture-pane -p -e -J: the visible screen with its SGR escapes, wrapped lines joined
    cursor_x: int
    cursor_y: int
    cols: int
    rows: int
    modes: Modes = field(default_factory=Modes)
    primary: bytes | None = None  # in the alternate screen: the primary one under it (capture-pane -a)
    saved: tuple[int, int] = (0, 0)  # in the alternate screen: the primary's cursor (x, y), restored on leaving

    @classmethod
    def of(cls, pane: dict, screen: bytes, primary: bytes | None) -> Snapshot:
        """From ``PANE_FORMAT``'s answer (``parse_pane``) and the captures (``CAPTURE``)."""
        saved = (int(pane["alternate_saved_x"] or 0), int(pane["alternate_saved_y"] or 0))
        grid = (int(pane[name]) for name in ("cursor_x", "cursor_y", "pane_width", "pane_height"))
        return cls(screen, *grid, modes_of(pane), primary, saved)

    @property
    def alternate(self) -> bool:
        return self.primary is not None

    def _draw(self, screen: bytes) -> bytes:
        return b"\x1b[H" + b"\r\n".join(screen.split(b"\n")[: self.rows]) + b"\x1b[0m"

    def render(self) -> bytes:
        """Bytes that draw this screen on a terminal of the same size, modes and cursor included. Blank lines
        first scroll whatever was shown before into the scrollback, so nothing earlier is wiped."""
        out = b"\x1b[0m" + b"\r\n" * self.rows
        if self.primary is not None:
            saved_x, saved_y = self.saved
            # 1049: the cursor is saved (where the primary's is) and the alternate screen shown, cleared.
            out += self._draw(self.primary) + f"\x1b[{saved_y + 1};{saved_x + 1}H\x1b[?1049h".encode()
        return out + self._draw(self.screen) + self.modes.render(self.cursor_x, self.cursor_y)


def parse_pane(line: str) -> dict:
    """``PANE_FORMAT``'s answer as {field: text}, with ``title``."""
    values = line.split("|", len(PANE_FIELDS))
    if len(values) != len(PANE_FIELDS) + 1:
        raise ValueError(f"not a pane's state: {line[:80]!r}")
    return dict(zip((*PANE_FIELDS, "title"), values, strict=True))


def modes_of(pane: dict) -> Modes:
    flag = lambda name: pane[name] == "1"  # noqa: E731
    rows = int(pane["pane_height"])
    region = (int(pane["scroll_region_upper"] or 0), int(pane["scroll_region_lower"] or rows - 1))
    mouse = 1003 if flag("mouse_all_flag") else 1002 if flag("mouse_button_flag") else 0
    return Modes(
        cursor_keys=flag("keypad_cursor_flag"),
        keypad=flag("keypad_flag"),
        mouse=mouse or (1000 if flag("mouse_standard_flag") else 0),
        mouse_sgr=flag("mouse_sgr_flag"),
        mouse_utf8=flag("mouse_utf8_flag"),
        wrap=flag("wrap_flag"),
        insert=flag("insert_flag"),
        origin=flag("origin_flag"),
        cursor_visible=flag("cursor_flag"),
        region=None if region == (0, rows - 1) else region,
        title=pane["title"],
        paste=flag("@tether_paste"),
        focus=flag("@tether_focus"),
    )


class ModeWatch:
    """The two modes tmux does not tell, followed in the pane's output: DECSET/DECRST (``CSI ? Pm h`` / ``l``) of
    2004 (bracketed paste) and 1004 (focus events). ``feed`` says which changed; ``known`` is what was seen (a
    mode not seen yet: what the session keeps, from an earlier owner, stands)."""

    SEQUENCE = re.compile(rb"\x1b\[\?([0-9;]*)([hl])")
    UNFINISHED = re.compile(rb"\x1b(\[(\?[0-9;]*)?)?")
    NAMES = {2004: "paste", 1004: "focus"}
    TAIL = 32  # a sequence cut between two reads: the end of one kept for the next

    def __init__(self):
        self.known: dict[str, bool] = {}
        self._tail = b""

    def feed(self, data: bytes) -> dict[str, bool]:
        if b"\x1b" not in data and not self._tail:
            return {}
        text = self._tail + data
        escape = text.rfind(b"\x1b", max(0, len(text) - self.TAIL))
        if escape >= 0 and self.UNFINISHED.fullmatch(text, escape):  # begun at the end: finished in the next read
            text, self._tail = text[:escape], text[escape:]
        else:
            self._tail = b""
        changed = {}
        for params, action in self.SEQUENCE.findall(text):
            for param in params.split(b";"):
                name = self.NAMES.get(int(param)) if param.isdigit() else None
                if name is not None:
                    changed[name] = action == b"h"
        changed = {name: on for name, on in changed.items() if self.known.get(name) != on}
        self.known.update(changed)
        return changed

    def commands(self, session: str) -> list[str]:
        """tmux commands that keep what was seen with ``session``, where ``modes_of`` reads it."""
        return [f"set-option -t ={session}: @tether_{name} {int(on)}" for name, on in self.known.items()]

    def over(self, snapshot: Snapshot) -> Snapshot:
        """The snapshot with what this owner saw, which is newer than what the session keeps."""
        return replace(snapshot, modes=replace(snapshot.modes, **self.known)) if self.known else snapshot
