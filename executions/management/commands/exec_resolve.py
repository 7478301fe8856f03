from executions.actions import Actor, get_execution, resolve_execution
from executions.management.base import ExecutionCommand


class Command(ExecutionCommand):
    help = "Resolve an execution whose outcome is unknown, freeing its machine's slot. The outcome stays unknown."

    def add_arguments(self, parser):
        parser.add_argument("scope")
        parser.add_argument("execution_id")
        parser.add_argument("--note", required=True, help="what evidence shows the process is gone")
        parser.add_argument("--json", action="store_true")

    def run(self, *args, **options):
        execution = get_execution(options["scope"], options["execution_id"])
        execution = resolve_execution(execution, actor=Actor.command("exec_resolve"), note=options["note"])
        self.print_execution(execution, options["json"])
