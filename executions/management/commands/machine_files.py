from executions.actions import Actor, get_machine, set_file_roots
from executions.management.base import ExecutionCommand


class Command(ExecutionCommand):
    help = (
        "Set the paths under which files may be listed, downloaded and uploaded on a machine through the API "
        "(docs/api.md, Files); with no --path, none may (the default)."
    )

    def add_arguments(self, parser):
        parser.add_argument("name")
        parser.add_argument(
            "--path", action="append", default=[], metavar="/ABSOLUTE/PATH", help="an allowed path (repeat for more)"
        )

    def run(self, *args, **options):
        machine = get_machine(options["name"])
        changed = set_file_roots(machine, options["path"], actor=Actor.command("machine_files"))
        paths = ", ".join(machine.file_roots) or "none"
        self.stdout.write(f"machine {machine.name}: file paths {paths}" + ("" if changed else " (unchanged)"))
