import json

from executions.management.base import ExecutionCommand
from executions.models import Machine, MachineState
from executions.presenters import machine_json


class Command(ExecutionCommand):
    help = "List machines: backend, where, state and who holds the command slot (deleted ones with --all)."

    def add_arguments(self, parser):
        parser.add_argument("--scope", help="only this owner scope")
        parser.add_argument("--all", action="store_true", help="include deleted machines")
        parser.add_argument("--json", action="store_true")

    def run(self, *args, **options):
        machines = Machine.objects.select_related("active_execution").order_by("name")
        if options["scope"]:
            machines = machines.filter(scope=options["scope"])
        if not options["all"]:
            machines = machines.exclude(state=MachineState.DELETED)
        rows = [machine_json(machine) for machine in machines]
        if options["json"]:
            self.stdout.write(json.dumps(rows))
            return
        if not rows:
            self.stdout.write("no machines")
        for row in rows:
            where = row["ref"] or row["host"]
            if row["backend"] != "docker" and row["ref"]:
                where = f"{row['ref']} on {row['host']}"
            slot = f"{row['slot']} ({row['slot_state']})" if row["slot"] else "free"
            self.stdout.write(
                f"{row['name']}  {row['backend']} {where}  scope {row['scope']}  {row['state']}  slot: {slot}"
            )
