"""The session protocol's vocabulary and messages, in one place (see docs/protocol.md).

Three parties speak it: the browser (JSON and binary frames over the WebSocket), the consumer, and the
owner worker (channel-layer messages). Each channel-layer message is a small frozen dataclass that encodes
itself to the layer's dict and decodes from it; each word both sides must agree on is an enum member that
carries its properties. The browser's copy of the words, ``frontend/wire.js``, is generated from this module
(``manage.py wire_js``) and a test fails when the two differ.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, fields
from enum import IntEnum, StrEnum
from functools import cache
from typing import ClassVar, Self

MAX_FRAME_BYTES = 64 * 1024
MAX_COLS, MAX_ROWS = 500, 200
# A client that sends more than TETHER_STRIKE_LIMIT bad frames within this window is closed with
# POLICY_VIOLATION (the limit is a setting so that a fuzzer can be let through).
STRIKE_WINDOW_SECONDS = 10.0
ATTACH_WAIT_SECONDS = 20.0
PROTOCOL_VERSION = 1
# The page acknowledges what it drew at once from ACK_AT_ONCE_BYTES new, and a few bytes (an echo, a prompt)
# ACK_IDLE_MS later, with whatever came meanwhile: the echo is not followed by an ack the next key queues
# behind. At most a third of the least flow window a worker gives a session (live.MIN_WINDOW_BYTES: a paused
# stream resumes at a third of its window), so a stream that filled its window never waits for the timer.
ACK_AT_ONCE_BYTES = 1024
ACK_IDLE_MS = 25
# Offsets fit in a JavaScript number, and in the channel layer's 64-bit integers.
MAX_INTEGER = 2**53


class ProtocolError(Exception):
    """A frame or message that breaks the protocol; its text is what the sender is told."""


class CloseCode(IntEnum):
    PAGE_LEFT = 4000  # the page closed its own socket (a grid change, a silent or stuck connection)
    SUPERSEDED = 4001
    FORBIDDEN = 4003
    POLICY_VIOLATION = 4008
    IDLE = 4010
    DEADLINE = 4011
    OUTPUT_LIMIT = 4012
    EXITED = 4013
    SERVER_RESTART = 4014
    CLOSED = 4015
    SHARE_ENDED = 4016  # the share link this observer came through was revoked or expired


class Reason(StrEnum):
    """Why a session's process ended, or why a viewer's socket was closed. ``close_code`` is what the
    viewer's socket closes with; ``auto_reset`` whether the next attach starts a fresh shell by itself
    (TETHER_AUTO_RESET): the ends whose outcome is known. ``stored``: a session's ``close_reason``."""

    close_code: CloseCode
    auto_reset: bool
    stored: bool

    def __new__(cls, value: str, close_code: CloseCode, auto_reset: bool, stored: bool) -> Reason:
        member = str.__new__(cls, value)
        member._value_ = value
        member.close_code, member.auto_reset, member.stored = close_code, auto_reset, stored
        return member

    EXITED = "exited", CloseCode.EXITED, True, True
    RESET = "reset", CloseCode.CLOSED, True, True
    KILLED = "killed", CloseCode.CLOSED, True, True
    FAILED = "failed", CloseCode.CLOSED, True, True
    COMPLETED = "completed", CloseCode.CLOSED, True, True
    SPAWN_FAILED = "spawn_failed", CloseCode.CLOSED, True, True
    NEVER_STARTED = "never_started", CloseCode.CLOSED, True, True
    # The worker holding a shell that cannot outlive it was stopped: ended (and proven gone) by us.
    SERVER_RESTART = "server_restart", CloseCode.SERVER_RESTART, True, True
    IDLE = "idle", CloseCode.IDLE, False, True
    DEADLINE = "deadline", CloseCode.DEADLINE, False, True
    OUTPUT_LIMIT = "output_limit", CloseCode.OUTPUT_LIMIT, False, True
    # Tether lost the process: unknown until an operator resolves it, so no fresh shell by itself.
    CONTROLLER_LOST = "controller_lost", CloseCode.SERVER_RESTART, False, True
    # Only ever said to a viewer (not stored): its socket, not the process, ends.
    LET_GO = "let_go", CloseCode.SERVER_RESTART, False, False
    POLICY_VIOLATION = "policy_violation", CloseCode.POLICY_VIOLATION, False, False
    LOGGED_OUT = "logged_out", CloseCode.FORBIDDEN, False, False
    NOT_ALLOWED = "not_allowed", CloseCode.CLOSED, False, False  # deactivated, or a permission taken away
    SHARE_REVOKED = "share_revoked", CloseCode.SHARE_ENDED, False, False
    SHARE_EXPIRED = "share_expired", CloseCode.SHARE_ENDED, False, False

    @classmethod
    def close_code_for(cls, value: str) -> CloseCode:
        """The close code for a reason read from the database or a message (CLOSED for one we do not know)."""
        return reason.close_code if (reason := cls._value2member_map_.get(value)) else CloseCode.CLOSED

    @classmethod
    def auto_resets(cls, value: str) -> bool:
        """Whether a reason read from the database or a message starts a fresh shell (False for one we do not know)."""
        return bool((reason := cls._value2member_map_.get(value)) and reason.auto_reset)


class Request(StrEnum):
    """An operator's (or the owner's user's) request to end a held process, and the reason it ends with."""

    reason: Reason

    def __new__(cls, value: str, reason: Reason) -> Request:
        member = str.__new__(cls, value)
        member._value_ = value
        member.reason = reason
        return member

    CANCEL = "cancel", Reason.KILLED
    KILL = "kill", Reason.KILLED
    FAIL = "fail", Reason.FAILED
    RESET = "reset", Reason.RESET
    COMPLETE = "complete", Reason.COMPLETED


class ErrorCode(StrEnum):
    """``error`` codes: what a refused frame or message was refused for."""

    ATTACH_REFUSED = "attach_refused"  # the worker does not (or no longer) hold a started process
    NOT_HELD = "not_held"  # the process is not running here
    SUPERSEDED = "superseded"  # another window is the viewer
    BAD_FRAME = "bad_frame"  # the browser's frame broke the protocol
    READ_ONLY = "read_only"  # an observer's keys, grid or reset: observers only watch
    NOT_WATCHING = "not_watching"  # the worker no longer lists this observer (silent too long): observe again
    NOT_WRITER = "not_writer"  # an API client's keys or grid while another person's window writes


class StatusCode(StrEnum):
    """``status`` codes beside their text, so the page never reads a sentence to learn a state."""

    STARTING = "starting"
    NO_WORKER = "no_worker"  # nobody took the session within ATTACH_WAIT_SECONDS; the socket closes
    NOT_KEPT = "not_kept"  # a closed session's final screen is past its retention
    OWNER_LOST = "owner_lost"  # its worker stopped beating: waiting for a takeover (or an unknown outcome)


def integer(value, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_INTEGER:
        raise ProtocolError(f"{name} must be an integer from 0 to 2^53")
    return value


def grid(message: dict) -> tuple[int, int] | None:
    """A message's ``cols`` and ``rows``, checked; None when it names no grid."""
    cols, rows = message.get("cols"), message.get("rows")
    if cols is None and rows is None:
        return None
    if not (isinstance(cols, int) and isinstance(rows, int) and not isinstance(cols, bool)):
        raise ProtocolError("cols and rows must be integers")
    if not (1 <= cols <= MAX_COLS and 1 <= rows <= MAX_ROWS):
        raise ProtocolError(f"grid {cols}x{rows} is out of range (1-{MAX_COLS} x 1-{MAX_ROWS})")
    return cols, rows


# --- channel-layer messages --------------------------------------------------------------------


class Message:
    """A channel-layer message: ``TYPE`` is its ``type`` (the handler it reaches), its fields the rest."""

    TYPE: ClassVar[str]

    def encode(self) -> dict:
        message = {"type": self.TYPE}
        for name in _names(type(self)):
            message[name] = getattr(self, name)
        return message

    @classmethod
    def decode(cls, message: dict) -> Self:
        try:
            return cls(**{name: message[name] for name in _names(cls) if name in message})
        except TypeError as error:  # a required field is missing
            raise ProtocolError(f"{message.get('type')}: {error}") from None


@cache
def _names(kind: type) -> tuple[str, ...]:
    return tuple(f.name for f in fields(kind))


# Viewer -> owner worker: each names the execution the viewer believes the worker holds, the viewer, and
# the viewer's own channel for answers.


@dataclass(frozen=True, slots=True)
class ToOwner(Message):
    execution: int
    viewer: str
    reply: str


@dataclass(frozen=True, slots=True)
class Attach(ToOwner):
    TYPE = "session.attach"
    attach: int | None = None  # numbered: a repeated delivery is answered once
    since: int = 0
    generation: int | None = None
    epoch: int | None = None
    cols: int | None = None
    rows: int | None = None
    by: str | None = None  # the person attaching, told to the window this one supersedes
    # The viewer's own socket following its session to a new owner, not a person's action: refused
    # (SUPERSEDED) when another window attached there first, which it must not take back.
    follow: bool = False


@dataclass(frozen=True, slots=True)
class Observe(ToOwner):
    """Watch the session read-only, beside its writer (no grid: an observer draws the writer's)."""

    TYPE = "session.observe"
    attach: int | None = None
    since: int = 0
    generation: int | None = None
    epoch: int | None = None
    by: str = ""  # who watches, told to the writer
    via: str = ""  # how: "share link", "staff", or "" (the shell's own user)


@dataclass(frozen=True, slots=True)
class Input(ToOwner):
    TYPE = "session.input"
    data: bytes = b""
    seq: int | None = None  # numbered: a repeated delivery is not written twice


@dataclass(frozen=True, slots=True)
class Resize(ToOwner):
    TYPE = "session.resize"
    cols: int = 80
    rows: int = 24


@dataclass(frozen=True, slots=True)
class Ack(ToOwner):
    TYPE = "session.ack"
    offset: int = 0


@dataclass(frozen=True, slots=True)
class Resend(ToOwner):
    TYPE = "session.resend"
    since: int = 0


@dataclass(frozen=True, slots=True)
class Keepalive(ToOwner):
    TYPE = "session.keepalive"
    observing: bool = False  # an observer's: the worker says when it no longer lists it


@dataclass(frozen=True, slots=True)
class Detach(ToOwner):
    TYPE = "session.detach"


@dataclass(frozen=True, slots=True)
class ResetShell(ToOwner):
    TYPE = "session.reset"


@dataclass(frozen=True, slots=True)
class Peek(ToOwner):
    """An API client's read of the output from ``since`` (at most ``size`` bytes), answered once on ``reply``
    with ``Peeked`` (or ``Done`` when refused). No viewer is attached and no flow window is held."""

    TYPE = "session.peek"
    since: int = 0
    size: int = 64 * 1024
    # A command on pipes (executions.pipes): ``since`` counts in this view ("all", "stdout" or "stderr"), and
    # the answer is the encoded stream from the first whole line with bytes of it there.
    view: str = ""


@dataclass(frozen=True, slots=True)
class ApiInput(ToOwner):
    """An API client's keys. ``viewer`` names the client (its token and client name): each (``viewer``,
    ``seq``) is written once however often it is delivered. Answered with ``Done``."""

    TYPE = "session.api_input"
    data: bytes = b""
    seq: int = 0
    by: str = ""  # the person the token belongs to: another person's open window refuses it
    claim: int = 0  # the number's record, taken (terminals.signals.api_input_taken) before it is written


@dataclass(frozen=True, slots=True)
class ApiResize(ToOwner):
    """An API client's grid, refused while a window is the writer (the window sets the grid). ``Done``."""

    TYPE = "session.api_resize"
    cols: int = 80
    rows: int = 24


TO_OWNER: dict[str, type[ToOwner]] = {kind.TYPE: kind for kind in ToOwner.__subclasses__()}


def decode_to_owner(message: dict) -> ToOwner:
    kind = TO_OWNER.get(message.get("type", ""))
    if kind is None:
        raise ProtocolError(f"unknown message type {str(message.get('type'))[:40]!r}")
    return kind.decode(message)


# Owner worker -> viewer. ``epoch`` is the owner's stream (its lease token): a viewer drops what a dead
# owner it has left behind still sends.


@dataclass(frozen=True, slots=True)
class Attached(Message):
    TYPE = "terminal.attached"
    attach: int | None
    offset: int
    end: int
    lost: int
    generation: int
    epoch: int
    execution: int
    screen: bytes | None = None  # the screen as it is now (tmux), drawn before the stream
    fresh: bool = False  # the same shell's stream restarted under a new owner: redraw
    process_state: str = "live"
    ends_with_worker: str = ""  # why this shell will not outlive its worker ("": a holder or tmux keeps it)
    tracked: bool = False  # its shell marks its commands (terminals.marks): they are on the record
    role: str = "writer"  # or "observer": read-only, drawing the writer's grid
    cols: int = 80  # the writer's grid
    rows: int = 24
    observers: tuple = ()  # who watches besides the writer: ({"name", "via"}, ...)

    def to_browser(self) -> dict:
        names = ("offset", "end", "lost", "generation", "epoch", "fresh", "ends_with_worker", "tracked", "role")
        names += ("cols", "rows")
        said = {name: getattr(self, name) for name in names}
        # Bytes lost past the buffer, tmux: the screen as it is now (base64), drawn before the stream.
        screen = base64.b64encode(self.screen).decode() if self.screen else None
        said["observers"] = [dict(observer) for observer in self.observers]
        return {"type": "attached", **said, "screen": screen, "process_state": self.process_state}


@dataclass(frozen=True, slots=True)
class Output(Message):
    TYPE = "terminal.output"
    offset: int
    data: bytes
    epoch: int


@dataclass(frozen=True, slots=True)
class Peeked(Message):
    """The answer to ``Peek``: ``data`` from ``offset`` (``lost`` bytes after ``since`` are no longer kept),
    where the output ends now, and whose stream it is (``survives``: a holder's offsets, the same for any owner)."""

    TYPE = "api.output"
    offset: int
    data: bytes
    start: int  # the first offset the worker still keeps
    end: int
    lost: int
    generation: int
    epoch: int
    survives: bool
    # How far the stream had gone when this owner attached (a holder's): offsets up to there are still coming
    # (read again from the holder), not past the end.
    written: int = 0
    cols: int = 80  # the grid its program draws for now (a screen rebuilt from the bytes needs it)
    rows: int = 24
    # A read of a view (``Peek.view``): where the view's kept bytes start and end (-1: no whole line kept).
    view_first: int = -1
    view_end: int = -1


@dataclass(frozen=True, slots=True)
class Done(Message):
    """The answer to an API client's input or grid: done, or refused with an ``ErrorCode`` and a sentence."""

    TYPE = "api.done"
    ok: bool
    code: str = ""
    text: str = ""


@dataclass(frozen=True, slots=True)
class Gap(Message):
    TYPE = "terminal.gap"
    offset: int
    lost: int
    epoch: int


@dataclass(frozen=True, slots=True)
class Refusal(Message):
    TYPE = "terminal.error"
    code: ErrorCode
    message: str


@dataclass(frozen=True, slots=True)
class ClosingSoon(Message):
    TYPE = "terminal.warning"
    reason: Reason
    seconds_left: int
    epoch: int


@dataclass(frozen=True, slots=True)
class Superseded(Message):
    TYPE = "terminal.superseded"
    epoch: int
    by: str | None = None


@dataclass(frozen=True, slots=True)
class Exited(Message):
    """The process ended: its recorded outcome, and who asked for the end when someone did."""

    TYPE = "terminal.exit"
    state: str
    evidence: str
    exit_code: int | None
    outcome: str
    reason: Reason
    generation: int
    epoch: int | None  # None when told from the record, after no owner holds the session
    by: str | None = None
    action: str | None = None
    why: str | None = None

    @classmethod
    def of(cls, execution, *, reason: Reason, generation: int, epoch: int | None, asked: dict) -> Exited:
        """What the record says of ``execution``'s end; ``asked`` is who asked for it (by, action, why)."""
        return cls(
            state=execution.state,
            evidence=execution.evidence,
            exit_code=execution.exit_code,
            outcome=execution.outcome_label,
            reason=reason,
            generation=generation,
            epoch=epoch,
            **asked,
        )

    def to_browser(self) -> dict:
        said = {name: getattr(self, name) for name in _names(type(self))}
        asked = ("by", "action", "why")  # said only when someone asked for the end
        return {"type": "exit", **{k: v for k, v in said.items() if k not in asked or v is not None}}


@dataclass(frozen=True, slots=True)
class CommandSeen(Message):
    """A typed command started or ended (``record``: its summary), or the shell's first prompt mark arrived
    (``record`` None): its commands are tracked."""

    TYPE = "terminal.command"
    record: dict | None
    tracked: bool
    epoch: int

    def to_browser(self) -> dict:
        return {"type": "command", "record": self.record, "tracked": self.tracked}


@dataclass(frozen=True, slots=True)
class Grid(Message):
    """The writer's grid changed, from ``offset`` on: observers draw the new one."""

    TYPE = "terminal.grid"
    offset: int
    cols: int
    rows: int
    epoch: int

    def to_browser(self) -> dict:
        return {"type": "grid", "offset": self.offset, "cols": self.cols, "rows": self.rows}


@dataclass(frozen=True, slots=True)
class Watchers(Message):
    """Who watches the session now (observers come and go), told to the writer and the observers."""

    TYPE = "terminal.watchers"
    observers: tuple
    epoch: int

    def to_browser(self) -> dict:
        return {"type": "observers", "observers": [dict(observer) for observer in self.observers]}


@dataclass(frozen=True, slots=True)
class NextGeneration(Message):
    TYPE = "terminal.generation"
    ended: int  # the generation that ended; the viewer attaches again to the next
    epoch: int
    reason: Reason = Reason.RESET


@dataclass(frozen=True, slots=True)
class Closed(Message):
    """The owner stopped serving the session without its process ending here (let go, lost lease)."""

    TYPE = "terminal.closed"
    reason: Reason
    text: str
    epoch: int


# --- the browser's copy ------------------------------------------------------------------------


def wire_js() -> str:
    """``frontend/wire.js``: the words above as the page uses them."""

    def table(enum) -> str:
        return "{\n" + "".join(f"  {m.name}: {m.value!r},\n".replace("'", '"') for m in enum) + "}"

    auto = ", ".join(f'"{r.value}"' for r in Reason if r.auto_reset)
    return (
        "// Generated from terminals/protocol.py by `manage.py wire_js`: do not edit (a test compares them).\n\n"
        f"export const PROTOCOL_VERSION = {PROTOCOL_VERSION};\n\n"
        "// When the page acknowledges what it drew (terminals/protocol.py says why).\n"
        f"export const ACK_AT_ONCE_BYTES = {ACK_AT_ONCE_BYTES};\n"
        f"export const ACK_IDLE_MS = {ACK_IDLE_MS};\n\n"
        f"export const CloseCode = Object.freeze({table(CloseCode)});\n\n"
        f"export const Reason = Object.freeze({table(Reason)});\n\n"
        f"export const ErrorCode = Object.freeze({table(ErrorCode)});\n\n"
        f"export const StatusCode = Object.freeze({table(StatusCode)});\n\n"
        f"export const Request = Object.freeze({table(Request)});\n\n"
        "// Ends after which the server answers a reattach with a fresh shell (TETHER_AUTO_RESET).\n"
        f"export const AUTO_RESET_REASONS = new Set([{auto}]);\n"
    )
