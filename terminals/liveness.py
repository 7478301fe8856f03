"""Whether a worker is gone: the one judge, for recovery's takeovers, the launch window's proof and an
operator's resolution.

What can be known depends on where it ran. On this host (the same boot) its pid and start time prove it gone,
or show it running or frozen (SIGSTOP, a debugger: fenced from its leases, but it may still carry out a step
it was in the middle of). On another host, or before a reboot, only its own word (stopped) or the silence of its
heartbeat past the lease TTL tells (``silent``)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum

from django.conf import settings
from django.db.models.functions import Now

from terminals.backends.procfs import ProcessIdentity, boot_id
from terminals.models import Worker, WorkerState


class Seen(StrEnum):
    NO_OWNER = "no owner"  # none recorded
    STOPPED = "stopped"  # it said so itself
    GONE = "gone"  # on this host: no such process (pid and start time)
    FROZEN = "frozen"  # on this host: the process is stopped
    RUNNING = "running"  # on this host: it runs
    ELSEWHERE = "elsewhere"  # another host or boot: its pid tells nothing here


@dataclass(frozen=True, slots=True)
class Liveness:
    seen: Seen
    why: str  # in words, naming the worker

    @property
    def proven_gone(self) -> bool:
        """It can do nothing more at all: none recorded, stopped by itself, or no longer a process here."""
        return self.seen in (Seen.NO_OWNER, Seen.STOPPED, Seen.GONE)

    @property
    def visible_here(self) -> bool:
        return self.seen in (Seen.GONE, Seen.FROZEN, Seen.RUNNING)


def process_seen(pid: int, started_at: int) -> tuple[Seen, str]:
    """The process (pid, start time) on this host: gone, frozen or running, and so in words."""
    identity = ProcessIdentity(pid=pid, start_time=started_at, boot_id=boot_id())
    if not identity.is_alive():
        return Seen.GONE, f"pid {pid} (started at tick {started_at}) is gone"
    if identity.is_stopped():
        return Seen.FROZEN, f"pid {pid} is stopped (SIGSTOP or a debugger)"
    return Seen.RUNNING, f"pid {pid} runs"


def judge(worker: Worker | None) -> Liveness:
    if worker is None:
        return Liveness(Seen.NO_OWNER, "no owner recorded")
    name = f"worker {worker.worker_id[:12]}"
    if worker.state == WorkerState.STOPPED:
        return Liveness(Seen.STOPPED, f"{name} stopped")
    if worker.host != settings.TETHER_HOST or worker.boot_id != boot_id():
        return Liveness(Seen.ELSEWHERE, f"{name} on {worker.host}")
    seen, why = process_seen(worker.pid, worker.process_started_at)
    return Liveness(seen, f"{name}: {why}")


def silent(worker: Worker) -> bool:
    """Its heartbeat has been silent past the lease TTL (the database's clock)."""
    ttl = timedelta(seconds=settings.TETHER_LEASE_TTL_SECONDS)
    return Worker.objects.filter(pk=worker.pk, heartbeat_at__lt=Now() - ttl).exists()
