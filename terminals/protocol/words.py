"""The session protocol's words: the limits, close codes, reasons, requests, error and status codes both the
worker and the page must agree on, each an enum member carrying its properties; and the checks of the numbers
and grids every party sends."""

from __future__ import annotations

from enum import IntEnum, StrEnum

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


class Role(StrEnum):
    """What a viewer is to the shell it views."""

    WRITER = "writer"  # types, and its window sets the grid
    OBSERVER = "observer"  # watches read-only, drawing the writer's grid


class Via(StrEnum):
    """How an observer came to watch another person's shell, as the writer is told and the record keeps it."""

    OWN = ""  # the shell's own user (another window of theirs)
    TEAM = "team"  # a teammate with watch on the workspace
    STAFF = "staff"  # staff who may watch every shell
    SHARE_LINK = "share link"  # whoever holds a share link


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
