from executions.actions import get_execution
from executions.management.base import ExecutionCommand


class Command(ExecutionCommand):
    help = "Show one execution by scope and id (or alias)."

    def add_arguments(self, parser):
        parser.add_argument("scope")
        parser.add_argument("execution_id")
        parser.add_argument("--json", action="store_true")

    def run(self, *args, **options):
        self.print_execution(get_execution(options["scope"], options["execution_id"]), options["json"])
