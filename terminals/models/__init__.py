"""Terminal models, one module per kind of thing; imported from here (``from terminals.models import X``)."""

from terminals.models.commands import CommandRecord, CommandSource, CommandState
from terminals.models.sessions import (
    FONT_SIZES,
    CloseReason,
    ProcessState,
    SessionEvent,
    SnapshotKind,
    TerminalSession,
    ViewerPreference,
)
from terminals.models.workers import (
    ProcessLease,
    Worker,
    WorkerEvent,
    WorkerState,
    lease_expired,
    lease_expiry_expression,
)

__all__ = [
    "FONT_SIZES",
    "CloseReason",
    "CommandRecord",
    "CommandSource",
    "CommandState",
    "ProcessLease",
    "ProcessState",
    "SessionEvent",
    "SnapshotKind",
    "TerminalSession",
    "ViewerPreference",
    "Worker",
    "WorkerEvent",
    "WorkerState",
    "lease_expired",
    "lease_expiry_expression",
]
