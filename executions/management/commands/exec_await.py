import time

from django.core.management.base import CommandError

from executions.actions import get_execution
from executions.management.base import ExecutionCommand
from executions.models import FINAL_STATES, State


class Command(ExecutionCommand):
    help = (
        "Wait until an execution reaches a final state (completed, cancelled or resolved) and show it. "
        "An unknown outcome is not final: it waits for an operator's resolution, and on timeout (exit 6) "
        "says that is what it waits for."
    )

    def add_arguments(self, parser):
        parser.add_argument("scope")
        parser.add_argument("execution_id")
        parser.add_argument("--timeout", type=float, default=60.0)
        parser.add_argument("--json", action="store_true")

    def run(self, *args, **options):
        deadline = time.monotonic() + options["timeout"]
        execution = get_execution(options["scope"], options["execution_id"])
        while execution.state not in FINAL_STATES:
            if time.monotonic() > deadline:
                self.print_execution(execution, options["json"])
                waiting = (
                    "its outcome is unknown until an operator resolves it (exec_resolve)"
                    if execution.state == State.UNKNOWN
                    else f"it is still {execution.state}"
                )
                raise CommandError(f"timed out after {options['timeout']}s: {execution}: {waiting}", returncode=6)
            time.sleep(0.1)
            execution.refresh_from_db()
        self.print_execution(execution, options["json"])
