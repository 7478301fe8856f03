"""Every operation that changes execution or machine state; each is a guarded write with its audit event.
One module per domain; callers use ``from executions import actions`` and ``actions.X``.

- ``executions``: submit, find, aliases, transitions, facts, cancel;
- ``machines``: register, move state, note, record a placement;
- ``common``: who asked (``Actor``), identities, the taken-slot refusal.
"""

from executions.actions.common import Actor, get_machine
from executions.actions.executions import (
    TRANSITIONS,
    add_alias,
    cancel_execution,
    claiming,
    find_execution,
    get_execution,
    record_fact,
    submit_execution,
    transition,
)
from executions.actions.machines import (
    MACHINE_TRANSITIONS,
    add_machine,
    note_machine,
    record_placement,
    set_file_roots,
    set_labels,
    set_machine_state,
    set_track_commands,
)

__all__ = [
    "MACHINE_TRANSITIONS",
    "TRANSITIONS",
    "Actor",
    "add_alias",
    "add_machine",
    "cancel_execution",
    "claiming",
    "find_execution",
    "get_execution",
    "get_machine",
    "note_machine",
    "record_fact",
    "record_placement",
    "set_file_roots",
    "set_labels",
    "set_machine_state",
    "set_track_commands",
    "submit_execution",
    "transition",
]
