import getpass
import os

from django.contrib.auth import get_user_model
from django.core.management.base import CommandError

from executions.actions import Actor, get_execution
from executions.errors import UsageError
from executions.management.base import ExecutionCommand
from terminals.resolution import ResolveRefused, resolve

PERMISSION = "executions.resolve_execution"


def operator(username: str | None):
    """The person resolving: ``--by``, else the login this command runs under (``SUDO_USER`` first), who
    must be an active staff user with the resolve permission."""
    name = username or os.environ.get("SUDO_USER") or getpass.getuser()
    user = get_user_model().objects.filter(username=name).first()
    if user is None:
        how = "" if username else f" (you are {name!r} here, which is no Tether user)"
        raise UsageError(f"say who resolves it: --by USERNAME, a staff user with the resolve permission{how}")
    if not (user.is_active and user.is_staff and user.has_perm(PERMISSION)):
        raise UsageError(f"{name} may not resolve executions: an active staff user with {PERMISSION} may")
    return user


class Command(ExecutionCommand):
    help = (
        "Resolve an execution whose outcome is unknown, freeing its machine's slot. Tether checks first that the "
        "old owner is drained or dead, the machine is the one it ran on, and the process is gone; the outcome "
        "stays unknown, and the event names who resolved it. There is no force flag."
    )

    def add_arguments(self, parser):
        parser.add_argument("scope")
        parser.add_argument("execution_id")
        parser.add_argument("--note", required=True, help="what you saw that shows the process is gone")
        parser.add_argument(
            "--by", help="your Tether username (default: the login you run this as); needs the resolve permission"
        )
        parser.add_argument("--json", action="store_true")

    def run(self, *args, **options):
        # A blank note is a malformed request, refused before anything is looked up (status 2, not a failed check).
        if not options["note"].strip():
            raise UsageError("--note is required: say what evidence shows the process is gone")
        actor = Actor.for_user(operator(options["by"]))
        execution = get_execution(options["scope"], options["execution_id"])
        try:
            execution, checks = resolve(execution, actor=actor, note=options["note"], via="command:exec_resolve")
        except ResolveRefused as refused:
            for check in refused.checks:
                self.stderr.write(str(check))
            # The checks are listed above; the error itself is their one-line summary.
            raise CommandError(str(refused).splitlines()[0], returncode=refused.exit_status) from None
        if not options["json"]:
            for check in checks:
                self.stdout.write(str(check))
        self.print_execution(execution, options["json"])
