from executions.management.machine_state import MachineStateCommand
from executions.models import MachineState


class Command(MachineStateCommand):
    help = "Start a stopped machine again: commands and shells may run on it."
    verb = "start"
    to_state = MachineState.RUNNING
    done = "started"
