"""Run an owner worker until SIGTERM/SIGINT."""

import asyncio
import logging
import re
import signal

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from config.loop import choose
from config.process import leave, settle_heap
from executions.models import Backend
from terminals.worker import OwnerWorker

log = logging.getLogger("terminals.worker")


class Command(BaseCommand):
    help = "Run an owner worker: claim pending executions, hold their processes, serve viewers."

    def add_arguments(self, parser):
        parser.add_argument("--backends", help="comma-separated subset of local,tmux,docker (default: all reachable)")
        parser.add_argument("--poll", type=float, default=0.5, help="seconds between polls when idle")
        parser.add_argument(
            "--http",
            default=settings.TETHER_WORKER_HTTP,
            help="HOST:PORT for /healthz, /readyz and /metrics (default TETHER_WORKER_HTTP; off when empty)",
        )

    def handle(self, *args, **options):
        backends = None
        if options["backends"]:
            backends = set(options["backends"].split(","))
            unknown = backends - set(Backend.values)
            if unknown:
                raise CommandError(f"unknown backends: {', '.join(sorted(unknown))}", returncode=2)
        http = options["http"] or ""
        if http and not re.fullmatch(r"[\w.:\[\]-]*:\d{1,5}", http):
            raise CommandError(f"--http wants HOST:PORT, not {http!r}", returncode=2)
        choose("TETHER_WORKER_LOOP")
        asyncio.run(self.serve(OwnerWorker(backends=backends, poll_interval=options["poll"], http=http)))
        leave(0)  # stopped and recorded: no need to wait for Python to take Django apart

    async def serve(self, worker: OwnerWorker) -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await worker.start()
        settle_heap()
        # Through the log (JSON with TETHER_LOG_FORMAT=json), as every other line the worker writes.
        log.info("worker %s ready (%s)", worker.worker.worker_id, ", ".join(sorted(worker.context.backends)))
        await worker.run(stop)
        log.info("worker %s stopped", worker.worker.worker_id)
