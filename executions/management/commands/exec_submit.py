from django.core.management.base import CommandError
from django.db import transaction

from executions.actions import Actor, add_alias, claiming, submit_execution
from executions.errors import UsageError
from executions.management.base import ExecutionCommand, require_fits
from executions.models import Execution, Kind
from executions.spec import ExecutionSpec, SpecError


class Command(ExecutionCommand):
    help = "Record an execution on a machine. Re-submitting the same spec under the same id runs nothing again."

    def add_arguments(self, parser):
        parser.add_argument("--scope", required=True)
        parser.add_argument("--id", required=True, dest="execution_id")
        parser.add_argument("--machine", required=True)
        parser.add_argument("--kind", default=Kind.COMMAND, choices=Kind.values)
        parser.add_argument("--cwd", default="")
        parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE")
        parser.add_argument("--cols", type=int)
        parser.add_argument("--rows", type=int)
        parser.add_argument("--session-seconds", type=int)
        parser.add_argument("--idle-seconds", type=int)
        parser.add_argument("--output-limit", type=int, dest="output_limit_bytes")
        parser.add_argument(
            "--pipes", action="store_true",
            help="Run it on pipes, not a terminal (pty: false): stdout and stderr apart; its stdin is written and "
            "closed through the API (POST /executions/ID/input)",
        )  # fmt: skip
        parser.add_argument(
            "--alias", action="append", default=[], metavar="SCOPE/ID",
            help="Another id that names this execution too (repeatable); one naming another execution is refused",
        )  # fmt: skip
        parser.add_argument("--json", action="store_true")
        parser.add_argument("argv", nargs="+", metavar="PROGRAM [ARGS...]")

    def run(self, *args, **options):
        require_fits(Execution, "scope", options["scope"], "--scope")
        require_fits(Execution, "execution_id", options["execution_id"], "--id")
        env = {}
        for pair in options["env"]:
            name, sep, value = pair.partition("=")
            if not sep or not name:
                raise CommandError(f"--env {pair!r} must look like NAME=VALUE", returncode=2)
            env[name] = value
        try:
            spec = ExecutionSpec.build(
                options["argv"],
                env=env,
                cwd=options["cwd"],
                cols=options["cols"],
                rows=options["rows"],
                session_seconds=options["session_seconds"],
                idle_seconds=options["idle_seconds"],
                output_limit_bytes=options["output_limit_bytes"],
                pty=not options["pipes"],
            )
        except SpecError as error:
            raise UsageError(str(error)) from None
        aliases = []
        for alias in options["alias"]:
            scope, sep, alias_id = alias.partition("/")
            if not sep:
                raise CommandError(f"--alias {alias!r} must look like SCOPE/ID", returncode=2)
            aliases.append((scope, alias_id))
        actor = Actor.command("exec_submit")
        with transaction.atomic():  # an alias refused: nothing is submitted
            claiming("", [(options["scope"], options["execution_id"]), *aliases])
            execution, created = submit_execution(
                scope=options["scope"],
                execution_id=options["execution_id"],
                machine_name=options["machine"],
                spec=spec,
                kind=options["kind"],
                actor=actor,
            )
            for scope, alias_id in aliases:
                add_alias(execution, scope, alias_id, actor=actor)
        if not created and not options["json"]:
            self.stderr.write("already submitted: returning the existing execution; nothing runs again")
        self.print_execution(execution, options["json"], created=created)
