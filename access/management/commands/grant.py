from access import actions
from access.actions import find_group, find_machine, find_user, matching
from access.models import Role
from executions.actions import Actor
from executions.labels import parse_label
from executions.management.base import ExecutionCommand


def subject_and_target(options) -> tuple[dict, dict]:
    who = {"user": find_user(options["user"])} if options["user"] else {"group": find_group(options["group"])}
    where = {"machine": find_machine(options["machine"])} if options["machine"] else {"label": options["label"]}
    return who, where


def add_selectors(parser) -> None:
    subject = parser.add_mutually_exclusive_group(required=True)
    subject.add_argument("--user", help="a user's login name")
    subject.add_argument("--group", help="a group's name (a team)")
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--machine", help="a machine's name")
    target.add_argument("--label", metavar="KEY=VALUE", help="every machine carrying this label")


class Command(ExecutionCommand):
    help = "Grant a user or a group a role (watch, use, operate) on a machine or on every machine with a label."

    def add_arguments(self, parser):
        add_selectors(parser)
        parser.add_argument("--role", required=True, choices=Role.values)
        parser.add_argument("--note", default="", help="why (kept in the audit event)")
        parser.add_argument("--by", default="", help="the staff user making the change (kept in the audit event)")

    def run(self, *args, **options):
        who, where = subject_and_target(options)
        actor = Actor.for_user(find_user(options["by"])) if options["by"] else Actor.command("grant")
        made, happened = actions.grant(role=options["role"], actor=actor, note=options["note"], **who, **where)
        self.stdout.write(f"{happened}: {made}")
        if options["label"]:
            reached = matching(*parse_label(options["label"]))
            names = ", ".join(machine.name for machine in reached)
            said = f"reaches {len(reached)} machine(s) now: {names}" if reached else "matches no machine yet"
            self.stdout.write(f"label {options['label']} {said}")
