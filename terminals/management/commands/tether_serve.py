"""The embedded mode: one process serving HTTP and WebSockets with the owner worker inside it."""

from __future__ import annotations

import asyncio
import logging

from django.conf import settings
from django.core.management.base import BaseCommand

from executions.actions import Actor, add_machine
from executions.models import Machine
from terminals.registry import embedded_backend_kind

log = logging.getLogger(__name__)


class Command(BaseCommand):
    help = "Serve Tether (HTTP + WebSockets) with an owner worker in the same process."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--no-worker", action="store_true", help="serve only; workers run elsewhere")

    def handle(self, *args, **options):
        from config.loop import choose

        choose("TETHER_WORKER_LOOP")  # before daphne.server makes its loop
        from daphne.server import Server, twisted_loop  # installs the asyncio reactor first
        from twisted.internet import defer, reactor

        from config.asgi import application
        from config.process import leave, settle_heap
        from terminals.worker import OwnerWorker

        if not Machine.objects.exists():
            kind = embedded_backend_kind()
            add_machine(
                name="this-host",
                backend=kind,
                ref="",  # a tmux machine's empty ref is the default socket (terminals.registry.tmux_backend)
                actor=Actor.command("tether_serve"),
            )
            self.stdout.write(f"added machine this-host ({kind})")

        stop = asyncio.Event()
        running: list[asyncio.Task] = []

        async def run_worker() -> None:
            worker = OwnerWorker()
            await worker.start()
            settle_heap()  # (daphne's application loaded, and the worker started)
            await worker.run(stop)

        def start_worker() -> None:
            if options["no_worker"] or not settings.TETHER_EMBEDDED_WORKER:
                settle_heap()
                return
            running.append(twisted_loop.create_task(run_worker()))

        def stop_worker():
            stop.set()
            if running:
                return defer.Deferred.fromFuture(asyncio.ensure_future(asyncio.wait(running, timeout=20)))
            return None

        reactor.callWhenRunning(start_worker)
        reactor.addSystemEventTrigger("before", "shutdown", stop_worker)
        endpoint = f"tcp:port={options['port']}:interface={options['host']}"
        self.stdout.write(f"serving on http://{options['host']}:{options['port']}/")
        self.stdout.flush()
        # websocket_timeout=-1: terminals are not cut off after daphne's default 24 hours.
        Server(application=application, endpoints=[endpoint], websocket_timeout=-1, signal_handlers=True).run()
        leave(0)  # the reactor stopped and the worker with it (see config/process.py)
