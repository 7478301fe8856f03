import time

from executions.actions import Actor
from executions.management.base import ExecutionCommand
from terminals.actions import drain_worker
from terminals.models import ProcessLease, WorkerState


class Command(ExecutionCommand):
    help = (
        "Drain an owner worker: it stops taking new work, leaves its tmux sessions for another worker to adopt, "
        "ends and records its other processes, and stops. WORKER is the worker id or a unique prefix of it."
    )

    def add_arguments(self, parser):
        parser.add_argument("worker")
        parser.add_argument("--reason", default="")
        parser.add_argument("--wait", type=float, default=60.0, help="seconds to wait until it has stopped (0: don't)")

    def run(self, *args, **options):
        worker = drain_worker(options["worker"], actor=Actor.command("drain_worker"), reason=options["reason"])
        self.stdout.write(f"worker {worker.worker_id} on {worker.host} (pid {worker.pid}): draining")
        deadline = time.monotonic() + options["wait"]
        while worker.state != WorkerState.STOPPED and time.monotonic() < deadline:
            time.sleep(0.2)
            worker.refresh_from_db()
        left = ProcessLease.objects.filter(worker=worker, released_at__isnull=True).count()
        self.stdout.write(f"worker {worker.worker_id}: {worker.state}; {left} session(s) left for adoption")
