"""machine_stop, machine_start and machine_delete: one guarded transition each, refused while the slot is held."""

from __future__ import annotations

from executions.actions import Actor, get_machine, set_machine_state
from executions.management.base import ExecutionCommand


class MachineStateCommand(ExecutionCommand):
    verb: str  # the command is machine_<verb>
    to_state: str
    done: str

    def add_arguments(self, parser):
        parser.add_argument("name")
        parser.add_argument("--reason", default="")

    def run(self, *args, **options):
        machine = get_machine(options["name"])
        actor = Actor.command(f"machine_{self.verb}")
        machine = set_machine_state(machine, self.to_state, actor=actor, reason=options["reason"])
        self.stdout.write(f"machine {machine.name} {self.done}")
