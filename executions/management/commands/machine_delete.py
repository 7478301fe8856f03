from executions.management.machine_state import MachineStateCommand
from executions.models import MachineState


class Command(MachineStateCommand):
    help = (
        "Mark a machine deleted (its record and history stay; its container or tmux server is not touched). "
        "Refused while its command slot is held."
    )
    verb = "delete"
    to_state = MachineState.DELETED
    done = "deleted"
