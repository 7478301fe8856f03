"""How a process ended, as one value: what its owner (or recovery) saw, turned into what is recorded.

The choice is kept apart from the writing (terminals.actions.settle_execution takes an Outcome) so that
every honesty rule about an outcome is in these few constructors, tested without a process: an exit is
recorded only when it was observed or read back; a tree we ended but could not prove gone is unknown.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from executions.models import Evidence, State
from terminals.backends.base import Exit
from terminals.protocol import Reason

# Ends we caused ourselves -> the evidence recorded for them (how the program itself took it is kept
# beside, as its signal).
ENDED_BY_US = {
    Reason.RESET: Evidence.RESET,
    Reason.KILLED: Evidence.KILLED,
    Reason.FAILED: Evidence.KILLED,
    Reason.IDLE: Evidence.IDLE_REAPED,
    Reason.DEADLINE: Evidence.DEADLINE,
    Reason.OUTPUT_LIMIT: Evidence.OUTPUT_LIMIT,
    Reason.SERVER_RESTART: Evidence.KILLED,
}


def exit_fields(exit: Exit) -> tuple[str, dict]:
    """The evidence and fields that record an observed exit."""
    if exit.code is None:
        return Evidence.SIGNALED, {"exit_signal": exit.signal}
    return (Evidence.EXIT_STATUS if exit.ambiguous else Evidence.EXITED), {"exit_code": exit.code}


@dataclass(frozen=True)
class Outcome:
    state: State  # completed or unknown
    evidence: Evidence
    note: str  # the sentence recorded as the reason
    close_reason: Reason  # the session's
    fields: dict = field(default_factory=dict)  # exit code or signal, as settle_execution takes them

    @classmethod
    def of(cls, exit: Exit | None, *, ended_for: Reason | None, lost: str) -> Outcome:
        """``exit`` as observed (None: none could be), ``ended_for`` the reason we ended it for (None: it
        ended by itself), ``lost`` why observation failed, if it did."""
        if exit is None or (ended_for is not None and lost):
            # No trustworthy exit, or we could not prove the tree we ended is gone.
            return cls(State.UNKNOWN, Evidence.CONTROLLER_LOST, lost, Reason.CONTROLLER_LOST)
        reason = ended_for or Reason.EXITED
        if reason in ENDED_BY_US:
            return cls(State.COMPLETED, ENDED_BY_US[reason], exit.describe(), reason, {"exit_signal": exit.signal})
        evidence, fields = exit_fields(exit)
        return cls(State.COMPLETED, evidence, exit.describe(), reason, fields)

    @classmethod
    def read_back(cls, exit: Exit, note: str) -> Outcome:
        """An exit read back after its owner died (from tmux's record, docker's inspect)."""
        evidence, fields = exit_fields(exit)
        return cls(State.COMPLETED, evidence, note, Reason.EXITED, fields)

    @classmethod
    def unknown(cls, note: str) -> Outcome:
        """No trustworthy exit can be had: unknown (controller_lost), the slot kept until an operator resolves it."""
        return cls(State.UNKNOWN, Evidence.CONTROLLER_LOST, note, Reason.CONTROLLER_LOST)

    @classmethod
    def spawn_failed(cls, error: str) -> Outcome:
        """Proven: nothing started."""
        return cls(State.COMPLETED, Evidence.SPAWN_FAILED, error, Reason.SPAWN_FAILED)

    @classmethod
    def never_started(cls, note: str) -> Outcome:
        return cls(State.COMPLETED, Evidence.NEVER_STARTED, note, Reason.NEVER_STARTED)

    @classmethod
    def ended_by_recovery(cls, note: str) -> Outcome:
        """Recovery ended what was left, and proved none of it runs."""
        return cls(State.COMPLETED, Evidence.KILLED, note, Reason.KILLED)
