from django.core.management.base import CommandError

from executions.actions import Actor, get_execution
from executions.errors import UsageError
from executions.management.base import ExecutionCommand
from terminals.resolution import ResolveRefused, resolve


class Command(ExecutionCommand):
    help = (
        "Resolve an execution whose outcome is unknown, freeing its machine's slot. Tether checks first that the "
        "old owner is drained or dead, the machine is the one it ran on, and the process is gone; the outcome "
        "stays unknown. There is no force flag."
    )

    def add_arguments(self, parser):
        parser.add_argument("scope")
        parser.add_argument("execution_id")
        parser.add_argument("--note", required=True, help="what you saw that shows the process is gone")
        parser.add_argument("--json", action="store_true")

    def run(self, *args, **options):
        # A blank note is a malformed request, refused before anything is looked up (status 2, not a failed check).
        if not options["note"].strip():
            raise UsageError("--note is required: say what evidence shows the process is gone")
        execution = get_execution(options["scope"], options["execution_id"])
        try:
            execution, checks = resolve(execution, actor=Actor.command("exec_resolve"), note=options["note"])
        except ResolveRefused as refused:
            for check in refused.checks:
                self.stderr.write(str(check))
            # The checks are listed above; the error itself is their one-line summary.
            raise CommandError(str(refused).splitlines()[0], returncode=refused.exit_status) from None
        if not options["json"]:
            for check in checks:
                self.stdout.write(str(check))
        self.print_execution(execution, options["json"])
