import time

from django.core.management.base import CommandError

from executions.actions import get_execution
from executions.management.base import ExecutionCommand
from executions.models import State

# States after which waiting longer changes nothing without an operator.
SETTLED = {State.COMPLETED, State.CANCELLED, State.RESOLVED, State.UNKNOWN}


class Command(ExecutionCommand):
    help = "Wait until an execution is settled (completed, cancelled, unknown or resolved) and show it."

    def add_arguments(self, parser):
        parser.add_argument("scope")
        parser.add_argument("execution_id")
        parser.add_argument("--timeout", type=float, default=60.0)
        parser.add_argument("--json", action="store_true")

    def run(self, *args, **options):
        deadline = time.monotonic() + options["timeout"]
        execution = get_execution(options["scope"], options["execution_id"])
        while execution.state not in SETTLED:
            if time.monotonic() > deadline:
                self.print_execution(execution, options["json"])
                raise CommandError(
                    f"timed out after {options['timeout']}s; {execution} is still {execution.state}", returncode=6
                )
            time.sleep(0.1)
            execution.refresh_from_db()
        self.print_execution(execution, options["json"])
