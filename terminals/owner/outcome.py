"""How a held process ended, as one value: what the owner saw, turned into what is recorded.

The choice is kept apart from the writing (terminals.actions.settle_execution) so that every honesty rule
about an outcome is in one small function, tested without a process: an exit is recorded only when it was
observed; a tree we ended but could not prove gone is unknown.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from executions.models import Evidence, State
from terminals import actions
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


@dataclass(frozen=True)
class Outcome:
    state: str  # completed or unknown
    evidence: str
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
        evidence, fields = actions.exit_record(exit)
        return cls(State.COMPLETED, evidence, exit.describe(), reason, fields)
