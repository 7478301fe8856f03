from access import actions
from access.actions import find_user
from access.management.commands.grant import add_selectors, subject_and_target
from executions.actions import Actor
from executions.management.base import ExecutionCommand


class Command(ExecutionCommand):
    help = "Take a grant away: its holders' open sockets on what it reached close at once."

    def add_arguments(self, parser):
        add_selectors(parser)
        parser.add_argument("--reason", default="", help="why (kept in the audit event)")
        parser.add_argument("--by", default="", help="the staff user making the change (kept in the audit event)")

    def run(self, *args, **options):
        who, where = subject_and_target(options)
        actor = Actor.for_user(find_user(options["by"])) if options["by"] else Actor.command("revoke")
        gone = actions.revoke(actor=actor, reason=options["reason"], **who, **where)
        self.stdout.write(f"revoked: {gone}")
