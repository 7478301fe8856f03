"""Shell integration: the OSC 133 marks a shell Tether starts prints at each prompt and each command, and
the reader that finds them in the output stream (docs/commands.md).

A mark is ``ESC ] 133 ; KIND ; key=value ; … BEL`` (or ``ESC \\`` for BEL):

- ``A``: a prompt starts (the shell waits for a command);
- ``B``: the prompt ends, the command line's input begins (POSIX shells, which cannot mark ``C``);
- ``C``: a command line was read and runs now (bash; ``cmdline``: the line as the shell's history has it,
  ``\\\\`` and ``\\xHH`` escaped; ``fresh=0`` when history did not take the line);
- ``D;STATUS``: the last command ended with ``STATUS`` (printed at every prompt; it means something only
  after a command ran). A POSIX shell's carries ``hist`` and ``cmdhex``: the number and line (hex) of the
  last line its history holds (busybox ash; empty where the shell keeps none, as dash).

Each carries ``tether=NONCE``: a secret of this shell, given to it in its environment, which it keeps in
an unexported variable. A mark without it (printed by a program: a file with marks in it, a nested shell,
an ssh session) is foreign and changes no record.
"""

from __future__ import annotations

import hmac
import re
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings

from terminals.backends.base import BackendError, SpawnSpec

PREFIX = b"\x1b]133;"
MAX_MARK_BYTES = 16 * 1024  # an escaped 2000-character command line fits several times over
MAX_TYPED_BYTES = 8 * 1024  # what is kept of the screen between a prompt and its command
STATUS = re.compile(r"[0-9]{1,3}")  # a shell's $? (ASCII digits only: "²" is a digit to str.isdigit)
BASH_SCRIPT = Path(__file__).parent / "shell" / "tether.bash"
SH_SCRIPT = Path(__file__).parent / "shell" / "tether.sh"
ZSH_DIR = Path(__file__).parent / "shell" / "zsh"  # a ZDOTDIR whose files read the user's own
BASH_HOOK = 'eval "$TETHER_BASH"'
# bash started with these alone is an interactive shell whose PROMPT_COMMAND comes from its environment.
INTERACTIVE_FLAGS = {"-l", "--login", "-i", "-il", "-li", "--noprofile", "--norc"}


def new_nonce() -> str:
    return secrets.token_hex(12)


def shell_of(spec: SpawnSpec) -> str:
    """Which integration ``spec``'s program takes: "bash", "sh" (busybox ash, dash: POSIX shells read an ENV
    file), or "" (another program, or a shell given a script or a command: it runs exactly as given)."""
    name = Path(spec.argv[0]).name if spec.argv else ""
    if not all(arg in INTERACTIVE_FLAGS for arg in spec.argv[1:]):
        return ""
    return {"bash": "bash", "zsh": "zsh", "sh": "sh", "ash": "sh", "dash": "sh"}.get(name, "")


async def plan(spec: SpawnSpec, *, machine_tracks: bool, place) -> tuple[SpawnSpec, str, str]:
    """How a terminal's shell starts: (spec, nonce, note). With the integration: the nonce its marks carry;
    without: why not (the note the page shows), and the spec as given. ``place(path)`` is where the shell
    reads one of Tether's files (the backend copies it into a container)."""
    if not settings.TETHER_TRACK_COMMANDS:
        return spec, "", "shell integration is off on this server (TETHER_TRACK_COMMANDS)"
    if not machine_tracks:
        return spec, "", "shell integration is off for this machine"
    shell = shell_of(spec)
    if not shell:
        program = " ".join(spec.argv)[:80]
        return spec, "", f"{program} is not a shell Tether integrates with (bash, zsh, sh)"
    nonce = new_nonce()
    env = {**spec.env, "TETHER_MARKS": nonce}
    if shell == "bash":
        # bash reads PROMPT_COMMAND from its environment: at the first prompt, after the user's own startup
        # files, it runs the script, which puts its hooks in place and takes itself out of PROMPT_COMMAND.
        theirs = spec.env.get("PROMPT_COMMAND", "")  # kept: the script takes only its own hook out
        env |= {"TETHER_BASH": BASH_SCRIPT.read_text(), "PROMPT_COMMAND": BASH_HOOK + (f"; {theirs}" if theirs else "")}
    else:
        # zsh reads its startup files from ZDOTDIR (Tether's, which read the user's); POSIX shells, ENV.
        variable, source, was = (
            ("ZDOTDIR", ZSH_DIR, "TETHER_ZDOTDIR") if shell == "zsh" else ("ENV", SH_SCRIPT, "TETHER_ENV_WAS")
        )
        try:
            env[variable] = await place(source)
        except BackendError as error:
            return spec, "", f"the shell integration could not be placed where the shell runs: {error}"
        if variable in spec.env:
            env[was] = spec.env[variable]
    return SpawnSpec(argv=spec.argv, env=env, cwd=spec.cwd, cols=spec.cols, rows=spec.rows), nonce, ""


@dataclass(frozen=True)
class Mark:
    kind: str  # A, C or D
    start: int  # the stream offset of its ESC
    end: int  # the offset just past it
    fields: dict[str, str] = field(default_factory=dict)
    status: int | None = None  # D: the shell's $?
    typed: str = ""  # C: what the screen showed between the prompt and the command (escapes removed)
    after: int = 0  # D: where the prompt before it ended (a POSIX shell's B mark), as read in order

    @property
    def command_line(self) -> str:
        return unescape(self.fields.get("cmdline", ""))

    @property
    def history(self) -> tuple[str, str] | None:
        """A POSIX shell's end mark: (number, line) of its history's last line; None for bash's."""
        if "hist" not in self.fields:
            return None
        try:
            line = bytes.fromhex(self.fields.get("cmdhex", "")).decode("utf-8", "replace")
        except ValueError:
            line = ""
        return self.fields["hist"], line

    @property
    def prompt(self) -> int | None:
        """bash, zsh: the number of the prompt a C mark's command was typed at, or that a D mark starts."""
        value = self.fields.get("p", "")
        return int(value) if value.isascii() and value.isdigit() and len(value) < 12 else None

    @property
    def fresh(self) -> bool:
        return self.fields.get("fresh") == "1"

    @property
    def at(self) -> float | None:
        """The shell's own clock when it printed the mark (seconds since the epoch), if it said."""
        try:
            return float(self.fields.get("at", "").replace(",", "."))
        except ValueError:
            return None


def unescape(text: str) -> str:
    """``\\\\`` and ``\\xHH`` back to what the shell escaped (bytes, then UTF-8)."""
    raw = text.encode("utf-8", "surrogateescape")
    out = re.sub(rb"\\(\\|x[0-9a-fA-F]{2})", lambda m: b"\\" if m[1] == b"\\" else bytes([int(m[1][1:], 16)]), raw)
    return out.decode("utf-8", "replace")


_ESCAPES = re.compile(
    rb"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-Z\\-_]|[\x00-\x07\x0b-\x1f\x7f]"
)


def visible(data: bytes) -> str:
    """What ``data`` shows as text, roughly: escape sequences and controls removed, backspaces applied."""
    text = _ESCAPES.sub(b"", data)
    out = bytearray()
    for byte in text:
        if byte == 0x08:
            if out:
                out.pop()
        else:
            out.append(byte)
    return out.decode("utf-8", "replace")


class MarkReader:
    """Finds this shell's marks in its output, a read at a time: a mark split across reads (or across the
    worker's death, when a holder replays its stream) is found whole once its end arrives."""

    def __init__(self, nonce: str):
        self.nonce = nonce
        self.pending = b""  # the start of a mark (or of its prefix) that the next read completes
        self.pending_at = 0
        self.typed: bytearray | None = None  # the screen since the last prompt mark, until its command
        self.prompt_len = 0  # where in ``typed`` the prompt ended (a B mark) and the command line began
        self.at_prompt = False  # a POSIX shell's prompt is shown and no Enter was typed since
        self.prompt_end = 0  # the stream offset where that prompt ended
        self.last_history: tuple[str, str] | None = None  # the last end mark's history line, as it said
        self.history_end = -1  # where that end mark ended in the stream
        self.foreign = 0  # marks without this shell's nonce: printed by a program, ignored

    def feed(self, offset: int, data: bytes) -> list[Mark]:
        if self.pending and self.pending_at + len(self.pending) == offset:
            data, offset = self.pending + data, self.pending_at
        self.pending = b""
        marks: list[Mark] = []
        at = 0
        while True:
            found = data.find(PREFIX, at)
            if found < 0:
                tail = _partial_prefix(data[at:])
                self._keep_typed(data[at : len(data) - tail])
                if tail:
                    self.pending, self.pending_at = data[-tail:], offset + len(data) - tail
                return marks
            self._keep_typed(data[at:found])
            end, stop = _terminator(data, found + len(PREFIX))
            if end == -1:
                if len(data) - found <= MAX_MARK_BYTES:
                    self.pending, self.pending_at = data[found:], offset + found
                return marks
            if end == -2:  # cut short by another escape sequence, as a terminal would cut it
                self.foreign += 1
                at = stop
                continue
            mark = self._mark(data[found + len(PREFIX) : end], offset + found, offset + stop)
            if mark:
                marks.append(mark)
            at = stop

    def resume(self, history: dict) -> None:
        """Go on from where an earlier owner left the shell's history (``TerminalSession.marks_history``): the
        first end mark read then tells a line pasted before that owner died, whose prompt is long gone."""
        self.last_history = (str(history["number"]), str(history["line"]))
        self.history_end = int(history["end"])
        self.prompt_end = max(self.prompt_end, self.history_end)

    def line_typed(self) -> str:
        """What the screen shows typed at the prompt since it ended (escapes removed; a line editor's
        redraws and wraps move to a new line, which this one line of input does not have)."""
        return visible(bytes((self.typed or b"")[self.prompt_len :])).replace("\n", "")

    def _keep_typed(self, data: bytes) -> None:
        if self.typed is not None and len(self.typed) < MAX_TYPED_BYTES:
            self.typed.extend(data[: MAX_TYPED_BYTES - len(self.typed)])

    def _mark(self, payload: bytes, start: int, end: int) -> Mark | None:
        parts = payload.decode("utf-8", "surrogateescape").split(";")
        kind, rest = parts[0], parts[1:]
        fields = dict(part.split("=", 1) for part in rest if "=" in part)
        # Whose it is first: nothing of a foreign mark is looked at further.
        if kind not in ("A", "B", "C", "D") or not hmac.compare_digest(
            fields.get("tether", "").encode("utf-8", "surrogateescape"), self.nonce.encode()
        ):
            self.foreign += 1
            return None
        status = None
        if kind == "D" and rest and STATUS.fullmatch(rest[0]):
            status = int(rest[0])
        typed = ""
        if kind == "A":
            self.typed, self.prompt_len, self.at_prompt = bytearray(), 0, False
        elif kind == "B":
            self.prompt_len = len(self.typed) if self.typed is not None else 0
            self.at_prompt = True
        elif kind == "C":
            typed = visible(bytes(self.typed or b""))
            self.typed = None
        mark = Mark(kind, start, end, fields, status, typed, self.prompt_end)
        if kind == "B":
            self.prompt_end = end
        return mark


def _terminator(data: bytes, start: int) -> tuple[int, int]:
    """Where the mark's payload ends and where the mark ends: at BEL or ST (ESC \\). (-1, -1) when its end
    is not here yet; (-2, i) when an escape at ``i`` cuts it short (a program cannot swallow the shell's
    next mark by leaving one of its own open)."""
    bel = data.find(b"\x07", start)
    esc = data.find(b"\x1b", start)
    if bel >= 0 and (esc < 0 or bel < esc):
        return bel, bel + 1
    if esc < 0 or esc + 1 == len(data):
        return -1, -1
    if data[esc + 1] == 0x5C:
        return esc, esc + 2
    return -2, esc


def _partial_prefix(data: bytes) -> int:
    """How many bytes at the end of ``data`` could begin a mark's prefix."""
    for size in range(min(len(PREFIX) - 1, len(data)), 0, -1):
        if data.endswith(PREFIX[:size]):
            return size
    return 0
