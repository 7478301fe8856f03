from asgiref.sync import async_to_sync
from django.core.management.base import BaseCommand

from executions.actions import Actor
from terminals import recovery
from terminals.console import recover_by_hand


class Command(BaseCommand):
    help = (
        "Settle the processes of dead owner workers: record exits that can be read back, mark the rest unknown, "
        "remove tagged tmux sessions nobody owns. Live tmux sessions are left for a worker to adopt (every worker "
        "also runs this at start and periodically). --dry-run only lists what would be done."
    )

    def add_arguments(self, parser):
        parser.add_argument("--dry-run", action="store_true")

    def handle(self, *args, **options):
        if options["dry_run"]:
            findings = async_to_sync(self._plan)()
            for finding in findings:
                self.stdout.write(f"would {finding}")
            if not findings:
                self.stdout.write("nothing to recover")
            return
        done = async_to_sync(self._recover)()
        for line in done:
            self.stdout.write(line)
        if not done:
            self.stdout.write("nothing to recover")

    async def _plan(self) -> list[recovery.Finding]:
        return await recovery.plan(can_adopt=False, can_watch=False) + await recovery.find_orphan_sessions()

    async def _recover(self) -> list[str]:
        return await recover_by_hand(Actor.command("recover_terminals"), "recover_terminals")
