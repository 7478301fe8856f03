import asyncio

from django.core.management.base import BaseCommand, CommandError

from demo import phases as demo
from demo.world import DemoFailed, docker_usable
from executions.errors import Refused


class Command(BaseCommand):
    help = (
        "Tether's promises end to end, on a docker machine (tmux when docker or the demo image is missing). "
        "run: write a file, resize, exit 7, check the exit and the slot, read the file back, delete the machine. "
        "shell: a terminal into the demo's shell (raw keys on a real terminal; lines starting with ':' are the "
        "demo's: :resize C R, :interrupt, :eof, :close). "
        "interrupt: kill the worker mid-session. recover: restart it and show the outcome (adopted, or unknown then "
        "resolved), checking the shell was launched once. delete: end (or resolve) what is open, then remove the "
        "demo machine."
    )

    def add_arguments(self, parser):
        parser.add_argument("phase", choices=["run", "shell", "delete", "interrupt", "recover"])
        parser.add_argument("--backend", choices=["auto", "docker", "tmux"], default="auto")

    def handle(self, *args, **options):
        backend = options["backend"]
        if backend == "auto":
            backend = "docker" if docker_usable() else "tmux"
        phase = options["phase"]
        try:
            asyncio.run(getattr(demo, phase)(backend))
        except (DemoFailed, Refused) as failed:  # a refused resolve or delete is a failed proof too
            raise CommandError(str(failed), returncode=1) from None
