from django.core.management.base import BaseCommand

from executions.actions import Actor
from terminals.actions import expire_closed_sessions


class Command(BaseCommand):
    help = (
        "Remove the final screens of terminal sessions closed longer ago than TETHER_RETENTION_HOURS (24 h). "
        "Session identity, exit, close reason, output cursor, execution records and events are kept. "
        "Workers also run this periodically."
    )

    def add_arguments(self, parser):
        parser.add_argument("--hours", type=int, default=None, help="retention in hours (default: the setting)")
        parser.add_argument("--dry-run", action="store_true")

    def handle(self, *args, **options):
        sessions = expire_closed_sessions(
            actor=Actor.command("cleanup_terminals"), hours=options["hours"], dry_run=options["dry_run"]
        )
        verb = "would expire" if options["dry_run"] else "expired"
        for session in sessions:
            self.stdout.write(f"{verb} the final screen of {session.id} (closed {session.closed_at:%Y-%m-%d %H:%M})")
        self.stdout.write(f"{len(sessions)} session(s) {verb}")
