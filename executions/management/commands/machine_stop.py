from executions.management.machine_state import MachineStateCommand
from executions.models import MachineState


class Command(MachineStateCommand):
    help = "Stop a machine: no new command or shell starts on it. Refused while its command slot is held."
    verb = "stop"
    to_state = MachineState.STOPPED
    done = "stopped"
