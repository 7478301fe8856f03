"""The channel-layer messages between a viewer's consumer (or an API call) and the owner worker: each a small
frozen dataclass that encodes itself to the layer's dict and decodes from it."""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import cache
from typing import ClassVar, Self

from terminals.protocol.words import ErrorCode, ProtocolError, Reason, Role, Via

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
    via: Via = Via.OWN  # how they came


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
    role: Role = Role.WRITER
    cols: int = 80  # the writer's grid
    rows: int = 24
    observers: tuple = ()  # who watches besides the writer: ({"name", "via"}, ...)
    grids: tuple = ()  # the grids the screen and bytes that follow were drawn for: ((offset, cols, rows), ...)


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


@dataclass(frozen=True, slots=True)
class CommandSeen(Message):
    """A typed command started or ended (``record``: its summary), or the shell's first prompt mark arrived
    (``record`` None): its commands are tracked."""

    TYPE = "terminal.command"
    record: dict | None
    tracked: bool
    epoch: int


@dataclass(frozen=True, slots=True)
class Grid(Message):
    """The writer's grid changed, from ``offset`` on: observers draw the new one."""

    TYPE = "terminal.grid"
    offset: int
    cols: int
    rows: int
    epoch: int


@dataclass(frozen=True, slots=True)
class Watchers(Message):
    """Who watches the session now (observers come and go), told to the writer and the observers."""

    TYPE = "terminal.watchers"
    observers: tuple
    epoch: int


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
