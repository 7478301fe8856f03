"""The browser's words over its WebSocket (docs/protocol.md), typed both ways like the worker's messages.

A text frame from the page is decoded once, here, into one of the ``FromPage`` dataclasses (its numbers and
grid checked), or refused with a ``ProtocolError`` saying why; binary frames are keys. What the server tells
the page is a ``ToPage`` dataclass that encodes itself to the JSON object the page reads. The types of both
directions are in ``frontend/wire.js`` (``manage.py wire_js``), so the page and the server name the same ones.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, fields
from typing import ClassVar, Self

from terminals.protocol import messages
from terminals.protocol.words import MAX_FRAME_BYTES, ErrorCode, ProtocolError, Reason, StatusCode, grid, integer

# --- page -> server ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FromPage:
    TYPE: ClassVar[str]

    @classmethod
    def parse(cls, message: dict) -> Self:
        return cls()


@dataclass(frozen=True, slots=True)
class Position:
    """Where an attach or observe asks to start: its offset, and the shell and owner's stream it is in."""

    since: int = 0
    generation: int | None = None
    epoch: int | None = None

    @staticmethod
    def of(message: dict) -> Position:
        generation, epoch = message.get("generation"), message.get("epoch")
        return Position(
            since=integer(message.get("since", 0), "since"),
            generation=None if generation is None else integer(generation, "generation"),
            epoch=None if epoch is None else integer(epoch, "epoch"),
        )


@dataclass(frozen=True, slots=True)
class Observe(FromPage):
    """Watch read-only beside the writer."""

    TYPE = "observe"
    at: Position = Position()

    @classmethod
    def parse(cls, message: dict) -> Self:
        return cls(at=Position.of(message))


@dataclass(frozen=True, slots=True)
class Attach(FromPage):
    """Be the writer, with this grid (None: the one the shell has). ``takeover``: into another user's shell."""

    TYPE = "attach"
    at: Position = Position()
    grid: tuple[int, int] | None = None
    takeover: bool = False

    @classmethod
    def parse(cls, message: dict) -> Self:
        return cls(at=Position.of(message), grid=grid(message), takeover=message["type"] == TakeOver.TYPE)


@dataclass(frozen=True, slots=True)
class TakeOver(Attach):
    """An attach into another user's shell: its user is told (decoded as an ``Attach`` with ``takeover``)."""

    TYPE = "takeover"


@dataclass(frozen=True, slots=True)
class Resize(FromPage):
    TYPE = "resize"
    cols: int = 80
    rows: int = 24

    @classmethod
    def parse(cls, message: dict) -> Self:
        if (size := grid(message)) is None:
            raise ProtocolError("resize needs cols and rows")
        return cls(*size)


@dataclass(frozen=True, slots=True)
class Reset(FromPage):
    TYPE = "reset"


@dataclass(frozen=True, slots=True)
class Ack(FromPage):
    """What the page has drawn, up to ``offset``."""

    TYPE = "ack"
    offset: int = 0

    @classmethod
    def parse(cls, message: dict) -> Self:
        return cls(integer(message.get("offset"), "ack offset"))


@dataclass(frozen=True, slots=True)
class Keepalive(FromPage):
    TYPE = "keepalive"


@dataclass(frozen=True, slots=True)
class Ping(FromPage):
    """The page's liveness check, with the keystroke echo times it measured (checked where they are counted)."""

    TYPE = "ping"
    echo_ms: object = None

    @classmethod
    def parse(cls, message: dict) -> Self:
        return cls(message.get("echo_ms"))


FROM_PAGE: dict[str, type[FromPage]] = {
    kind.TYPE: kind for kind in (Observe, Attach, TakeOver, Resize, Reset, Ack, Keepalive, Ping)
}


def decode(text: str) -> FromPage:
    """A text frame from the page, decoded and checked; a ``ProtocolError`` says what is wrong with it."""
    if len(text.encode()) > MAX_FRAME_BYTES:
        raise ProtocolError(f"control frame is over the {MAX_FRAME_BYTES}-byte limit")
    try:
        message = json.loads(text)
    except (ValueError, RecursionError):  # nesting deeper than the parser goes is malformed too
        raise ProtocolError("malformed JSON in a control frame") from None
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        raise ProtocolError("a control frame must be a JSON object with a string 'type'")
    kind = FROM_PAGE.get(message["type"])
    if kind is None:
        raise ProtocolError(f"unknown message type {message['type'][:40]!r}")
    return kind.parse(message)


# --- server -> page ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ToPage:
    """A message to the page: ``TYPE`` and its fields, less the ``OPTIONAL`` ones that are None."""

    TYPE: ClassVar[str]
    OPTIONAL: ClassVar[frozenset[str]] = frozenset()

    def encode(self) -> dict:
        said = {"type": self.TYPE}
        for field in fields(self):
            value = getattr(self, field.name)
            if value is not None or field.name not in self.OPTIONAL:
                said[field.name] = value
        return said

    def dumps(self) -> str:
        """As the text frame the page reads."""
        return json.dumps(self.encode())


@dataclass(frozen=True, slots=True)
class Hello(ToPage):
    TYPE = "hello"
    session: str
    protocol: int


@dataclass(frozen=True, slots=True)
class Status(ToPage):
    """Where finding the shell's worker stands (``code``), in words; ``process_state`` when it says one."""

    TYPE = "status"
    OPTIONAL = frozenset({"process_state"})
    code: StatusCode
    text: str
    process_state: str | None = None


@dataclass(frozen=True, slots=True)
class Error(ToPage):
    TYPE = "error"
    code: ErrorCode
    message: str


@dataclass(frozen=True, slots=True)
class Closed(ToPage):
    """Why the socket is about to close (its close code says the same)."""

    TYPE = "closed"
    reason: Reason
    text: str


@dataclass(frozen=True, slots=True)
class Pong(ToPage):
    TYPE = "pong"


@dataclass(frozen=True, slots=True)
class TakenOver(ToPage):
    """Someone else wrote into this user's shell (``by``, at ``at``, ISO 8601): the page says it once."""

    TYPE = "taken_over"
    by: str
    at: str


@dataclass(frozen=True, slots=True)
class Gap(ToPage):
    TYPE = "gap"
    offset: int
    lost: int


@dataclass(frozen=True, slots=True)
class ClosingWarning(ToPage):
    """The session closes in ``seconds_left`` for ``reason`` (idle or its deadline) unless something changes."""

    TYPE = "warning"
    reason: Reason
    seconds_left: int


@dataclass(frozen=True, slots=True)
class Superseded(ToPage):
    """Another window (or ``by``, another person taking the shell over) is the writer now."""

    TYPE = "superseded"
    OPTIONAL = frozenset({"by"})
    text: str
    by: str | None = None


@dataclass(frozen=True, slots=True)
class Fresh(ToPage):
    """A fresh shell was started in this session: the page clears and attaches again."""

    TYPE = "reset"
    text: str = "Started a fresh session"


@dataclass(frozen=True, slots=True)
class Attached(ToPage):
    """Attached: the stream from ``offset`` (``lost`` bytes before it are not kept) up to ``end`` follows."""

    TYPE = "attached"
    offset: int
    end: int
    lost: int
    generation: int
    epoch: int
    fresh: bool
    ends_with_worker: str
    tracked: bool
    role: str
    cols: int
    rows: int
    observers: list
    screen: str | None  # tmux: the screen as it is now (base64), drawn before the stream
    process_state: str
    grids: list  # [[offset, cols, rows], ...]: the grids what follows was drawn for ([]: the grid it has now)

    @classmethod
    def of(cls, message: messages.Attached) -> Attached:
        names = ("offset", "end", "lost", "generation", "epoch", "fresh", "ends_with_worker", "tracked", "role")
        return cls(
            **{name: getattr(message, name) for name in (*names, "cols", "rows", "process_state")},
            observers=[dict(observer) for observer in message.observers],
            screen=base64.b64encode(message.screen).decode() if message.screen else None,
            grids=[list(grid) for grid in message.grids],
        )


@dataclass(frozen=True, slots=True)
class Exit(ToPage):
    """The process ended: its recorded outcome, and who asked for the end when someone did."""

    TYPE = "exit"
    OPTIONAL = frozenset({"by", "action", "why"})  # said only when someone asked for the end
    state: str
    evidence: str
    exit_code: int | None
    outcome: str
    reason: Reason
    generation: int
    epoch: int | None
    by: str | None = None
    action: str | None = None
    why: str | None = None

    @classmethod
    def of(cls, message: messages.Exited) -> Exit:
        return cls(**{field.name: getattr(message, field.name) for field in fields(cls)})


@dataclass(frozen=True, slots=True)
class Command(ToPage):
    TYPE = "command"
    record: dict | None
    tracked: bool


@dataclass(frozen=True, slots=True)
class Grid(ToPage):
    """The writer's grid from ``offset`` on (observers draw it)."""

    TYPE = "grid"
    offset: int
    cols: int
    rows: int


@dataclass(frozen=True, slots=True)
class Observers(ToPage):
    TYPE = "observers"
    observers: list

    @classmethod
    def of(cls, observers: tuple) -> Observers:
        return cls([dict(observer) for observer in observers])


def relayed(message: messages.ClosingSoon | messages.CommandSeen | messages.Grid | messages.Watchers) -> ToPage:
    """What the page is told of an owner's message it hears as it is."""
    match message:
        case messages.ClosingSoon(reason=reason, seconds_left=seconds_left):
            return ClosingWarning(reason, seconds_left)
        case messages.CommandSeen(record=record, tracked=tracked):
            return Command(record, tracked)
        case messages.Grid(offset=offset, cols=cols, rows=rows):
            return Grid(offset, cols, rows)
        case messages.Watchers(observers=observers):
            return Observers.of(observers)
    raise TypeError(f"not a message the page is told as it is: {message!r}")


TO_PAGE: tuple[type[ToPage], ...] = (
    Hello, Status, Error, Closed, Pong, TakenOver, Gap, ClosingWarning, Superseded, Fresh, Attached, Exit, Command,
    Grid, Observers,
)  # fmt: skip
