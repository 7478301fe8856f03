"""Domain errors. Each carries the CLI exit status staff scripts rely on."""

from __future__ import annotations


class ExecutionError(Exception):
    exit_status = 1


class UsageError(ExecutionError):
    """The request itself is malformed (bad spec, bad name)."""

    exit_status = 2


class IdentityConflict(ExecutionError):
    """The (scope, execution_id) already names a different execution."""

    exit_status = 3


class Refused(ExecutionError):
    """A guard refused the change: the slot is taken or the state does not allow it."""

    exit_status = 4


class TransitionRefused(Refused):
    def __init__(self, label: str, current: str | None, wanted: str, why: str = ""):
        self.current = current
        self.wanted = wanted
        if current is None:
            message = f"{label} no longer exists"
        else:
            message = f"{label} is {current}; cannot move it to {wanted}"
        super().__init__(f"{message}{': ' + why if why else ''}")


class SlotTaken(Refused):
    def __init__(self, machine_name: str, holder_label: str, holder_state: str, doing: str, holder_pk=None):
        self.machine_name, self.doing = machine_name, doing
        self.holder_label = holder_label
        self.holder_state = holder_state
        self.holder_pk = holder_pk  # whose it is decides who may be told its name
        super().__init__(
            f"cannot {doing}: machine {machine_name}'s command slot is held by {holder_label} ({holder_state})"
        )

    def unnamed(self) -> str:
        """The same, for someone who may not see the holder: it is another user's, and in what state."""
        return f"cannot {self.doing}: machine {self.machine_name}'s command slot is held by another user's command"


class NotFound(ExecutionError):
    exit_status = 5
