"""Every operation that changes worker, lease or terminal-session state; each is a guarded write with its
audit event. One module per domain; callers use ``from terminals import actions`` and ``actions.X``.

- ``workers``: register, heartbeat, drain, stop;
- ``fencing``: the lease's fence every write of an owner goes through;
- ``leases``: claim, fenced writes, the launch's steps, settling, taking over a dead owner's lease;
- ``sessions``: open, next generation, close, viewers, take-overs, preferences;
- ``operator``: requests to a process's owner and operator actions on sessions;
- ``permissions``: who may open, view or take over a shell (checks only);
- ``retention``: removing long-closed sessions' screens;
- ``commands``: the commands typed into sessions, as their shells' marks told them.

Recordings and share links are an app of their own (``recordings.actions``).
"""

from executions.actions import Actor
from terminals.actions.commands import (
    begin_marks,
    command_ended_at_prompt,
    command_finished,
    command_started,
    marks_seen,
    session_commands,
    tracking,
)
from terminals.actions.commands import summary as command_summary
from terminals.actions.fencing import LeaseLost, fenced
from terminals.actions.leases import (
    begin_spawn,
    claim_next_execution,
    fenced_transition,
    lease_expiry,
    lease_follows,
    note_holder_ended,
    record_adoption,
    release_lease,
    save_handle,
    save_output,
    settle_execution,
    take_over_lease,
)
from terminals.actions.operator import (
    OPERATOR_ACTIONS,
    REQUESTABLE,
    closed_by,
    operator_session_action,
    request_process_action,
)
from terminals.actions.permissions import (
    OBSERVE_PERMISSION,
    TAKEOVER_PERMISSION,
    in_use_refusal,
    may_observe,
    may_operate,
    may_see_machine,
    may_share,
    may_take_over,
    may_use_machine,
    may_view_session,
)
from terminals.actions.retention import expire_closed_sessions
from terminals.actions.sessions import (
    close_session,
    font_size_of,
    last_takeover,
    note_observer,
    note_takeover,
    note_viewer,
    open_terminal,
    session_event,
    set_font_size,
    start_next_generation,
)
from terminals.actions.workers import (
    drain_worker,
    note_recovery_run,
    register_worker,
    stop_worker,
    worker_heartbeat,
)

__all__ = [
    "OBSERVE_PERMISSION",
    "OPERATOR_ACTIONS",
    "REQUESTABLE",
    "TAKEOVER_PERMISSION",
    "Actor",
    "LeaseLost",
    "begin_marks",
    "begin_spawn",
    "claim_next_execution",
    "close_session",
    "closed_by",
    "command_ended_at_prompt",
    "command_finished",
    "command_started",
    "command_summary",
    "drain_worker",
    "expire_closed_sessions",
    "fenced",
    "fenced_transition",
    "font_size_of",
    "in_use_refusal",
    "last_takeover",
    "lease_expiry",
    "lease_follows",
    "marks_seen",
    "may_observe",
    "may_operate",
    "may_see_machine",
    "may_share",
    "may_take_over",
    "may_use_machine",
    "may_view_session",
    "note_holder_ended",
    "note_observer",
    "note_recovery_run",
    "note_takeover",
    "note_viewer",
    "open_terminal",
    "operator_session_action",
    "record_adoption",
    "register_worker",
    "release_lease",
    "request_process_action",
    "save_handle",
    "save_output",
    "session_commands",
    "session_event",
    "set_font_size",
    "settle_execution",
    "start_next_generation",
    "stop_worker",
    "take_over_lease",
    "tracking",
    "worker_heartbeat",
]
