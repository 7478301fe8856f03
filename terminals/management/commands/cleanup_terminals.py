from django.core.management.base import BaseCommand

from executions.actions import Actor
from recordings.actions import expire_recordings, remove_leftover_chunks
from terminals.actions import expire_closed_sessions


class Command(BaseCommand):
    help = (
        "Remove the final screens of terminal sessions closed longer ago than TETHER_RETENTION_HOURS (24 h), and "
        "the files of recordings finished longer ago than TETHER_RECORDING_RETENTION_DAYS (30). Session identity, "
        "exit, close reason, output cursor, a recording's times and markers, execution records and events are "
        "kept; chunk files of recordings no longer being made (left by a worker that died) are removed. Workers "
        "also run this periodically."
    )

    def add_arguments(self, parser):
        parser.add_argument("--hours", type=int, default=None, help="screens' retention, hours (default: the setting)")
        parser.add_argument(
            "--recording-days", type=int, default=None, help="recordings' retention in days (default: the setting)"
        )
        parser.add_argument("--dry-run", action="store_true")

    def handle(self, *args, **options):
        actor, dry_run = Actor.command("cleanup_terminals"), options["dry_run"]
        sessions = expire_closed_sessions(actor=actor, hours=options["hours"], dry_run=dry_run)
        verb = "would expire" if dry_run else "expired"
        for session in sessions:
            self.stdout.write(f"{verb} the final screen of {session.id} (closed {session.closed_at:%Y-%m-%d %H:%M})")
        self.stdout.write(f"{len(sessions)} session(s) {verb}")
        recordings = expire_recordings(actor=actor, days=options["recording_days"], dry_run=dry_run)
        verb = "would remove" if dry_run else "removed"
        for recording in recordings:
            finished = f"{recording.finished_at:%Y-%m-%d %H:%M}"
            self.stdout.write(f"{verb} recording {recording.pk} of {recording.session_id} (finished {finished})")
        self.stdout.write(f"{len(recordings)} recording(s) {'would be removed' if dry_run else 'removed'}")
        leftover = remove_leftover_chunks(dry_run=dry_run)
        outcome = "would be removed" if dry_run else "removed"
        self.stdout.write(f"{leftover} chunk file(s) of recordings no longer being made {outcome}")
