"""Every operation that changes worker, lease or terminal-session state; each is a guarded write with its
audit event. One module per domain; callers use ``from terminals import actions`` and ``actions.X``.

- ``workers``: register, heartbeat, drain, stop;
- ``fencing``: the lease's fence every write of an owner goes through;
- ``leases``: claim, fenced writes, the launch's steps, settling, taking over a dead owner's lease;
- ``sessions``: open, next generation, close, viewers, take-overs, preferences;
- ``operator``: requests to a process's owner and operator actions on sessions;
- ``permissions``: who may open, view or take over a shell (checks only);
- ``retention``: removing long-closed sessions' screens;
- ``commands``: the commands typed into sessions, as their shells' marks told them;
- ``recordings``: sessions' recordings, written, finished, expired and read;
- ``shares``: share links to a live session or a recording.
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
    may_revoke_share,
    may_see_machine,
    may_share,
    may_take_over,
    may_use_machine,
    may_view_session,
)
from terminals.actions.recordings import (
    begin_recording,
    cast_lines,
    expire_recordings,
    finish_recording,
    note_recording_seen,
    remove_leftover_chunks,
    unfinished_recordings,
    write_chunk,
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
from terminals.actions.shares import (
    create_share_link,
    link_ended,
    note_share_opened,
    revoke_share_link,
    share_group,
    share_links_of,
    valid_share_link,
    withdraw_share_link,
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
    "begin_recording",
    "begin_spawn",
    "cast_lines",
    "claim_next_execution",
    "close_session",
    "closed_by",
    "command_ended_at_prompt",
    "command_finished",
    "command_started",
    "command_summary",
    "create_share_link",
    "drain_worker",
    "expire_closed_sessions",
    "expire_recordings",
    "fenced",
    "fenced_transition",
    "finish_recording",
    "font_size_of",
    "in_use_refusal",
    "last_takeover",
    "lease_expiry",
    "lease_follows",
    "link_ended",
    "marks_seen",
    "may_observe",
    "may_operate",
    "may_revoke_share",
    "may_see_machine",
    "may_share",
    "may_take_over",
    "may_use_machine",
    "may_view_session",
    "note_holder_ended",
    "note_observer",
    "note_recording_seen",
    "note_recovery_run",
    "note_share_opened",
    "note_takeover",
    "note_viewer",
    "open_terminal",
    "operator_session_action",
    "record_adoption",
    "register_worker",
    "release_lease",
    "remove_leftover_chunks",
    "request_process_action",
    "revoke_share_link",
    "save_handle",
    "save_output",
    "session_commands",
    "session_event",
    "set_font_size",
    "settle_execution",
    "share_group",
    "share_links_of",
    "start_next_generation",
    "stop_worker",
    "take_over_lease",
    "tracking",
    "unfinished_recordings",
    "valid_share_link",
    "withdraw_share_link",
    "worker_heartbeat",
    "write_chunk",
]
