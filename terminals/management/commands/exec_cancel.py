import time

from django.core.management.base import CommandError

from executions.actions import Actor, cancel_execution, get_execution
from executions.errors import TransitionRefused
from executions.management.base import ExecutionCommand
from executions.models import State
from terminals.actions import request_process_action

SETTLED = {State.COMPLETED, State.CANCELLED, State.RESOLVED, State.UNKNOWN}


class Command(ExecutionCommand):
    help = (
        "Cancel an execution. Pending: cancelled, nothing ran. Dispatched or running: its owner ends the process "
        "tree; completed (killed) only when the tree is proven gone, else unknown."
    )

    def add_arguments(self, parser):
        parser.add_argument("scope")
        parser.add_argument("execution_id")
        parser.add_argument("--reason", default="")
        parser.add_argument("--wait", type=float, default=30.0, help="seconds to wait for the owner to act")
        parser.add_argument("--json", action="store_true")

    def run(self, *args, **options):
        actor = Actor.command("exec_cancel")
        execution = get_execution(options["scope"], options["execution_id"])
        if execution.state == State.PENDING:
            try:
                execution = cancel_execution(execution, actor=actor, reason=options["reason"])
            except TransitionRefused:
                execution.refresh_from_db()  # a worker dispatched it meanwhile: cancel through the owner
        if execution.state in (State.DISPATCHED, State.RUNNING):
            request_process_action(execution, "cancel", actor=actor, reason=options["reason"])
            deadline = time.monotonic() + options["wait"]
            while execution.state not in SETTLED and time.monotonic() < deadline:
                time.sleep(0.1)
                execution.refresh_from_db()
            if execution.state not in SETTLED:
                # Never exit 0 having ended nothing: the request stands, and whoever holds it acts on it.
                self.print_execution(execution, options["json"])
                raise CommandError(
                    f"timed out after {options['wait']}s: {execution} is still {execution.state}; "
                    "the cancel request stands and its owner ends it when it can",
                    returncode=6,
                )
        elif execution.state not in SETTLED:
            raise TransitionRefused(str(execution), execution.state, "cancelled")
        self.print_execution(execution, options["json"])
