import json

from access.actions import find_machine
from access.models import GrantEvent
from access.report import who_can_reach
from executions.labels import said
from executions.management.base import ExecutionCommand


class Command(ExecutionCommand):
    help = "Who can reach a machine, with which role, and why (grants, groups, labels, staff permissions)."

    def add_arguments(self, parser):
        parser.add_argument("machine")
        parser.add_argument("--json", action="store_true")
        parser.add_argument("--history", action="store_true", help="also every grant change that touched it")

    def run(self, *args, **options):
        machine = find_machine(options["machine"])
        reached = who_can_reach(machine)
        if options["json"]:
            rows = [{"user": r.username, "role": r.role, "why": list(r.why)} for r in reached]
            self.stdout.write(json.dumps({"machine": machine.name, "labels": machine.labels or {}, "reached": rows}))
            return
        self.stdout.write(f"{machine.name} ({machine.backend}), labels: {said(machine.labels or {})}")
        if not reached:
            self.stdout.write("nobody but superusers can reach it (no grant, no staff permission)")
        for row in reached:
            self.stdout.write(f"  {row.username:<24} {row.role:<8} {'; '.join(row.why)}")
        if options["history"]:
            for event in grant_history(machine):
                self.stdout.write(f"  {event.at:%Y-%m-%d %H:%M:%S} {event.actor}: {event}")


def grant_history(machine):
    """Every grant change on the machine itself or on a label it carries now."""
    events = GrantEvent.objects.filter(machine=machine)
    for key, value in (machine.labels or {}).items():
        events = events | GrantEvent.objects.filter(label_key=key, label_value=value)
    return events.order_by("at", "id")
