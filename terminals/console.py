"""The recovery console's reading of the record (the admin's Workers, Recovery and Unknown outcomes pages): what
each worker holds and how it is, what a recovery pass would do, how a drain went, and for every unknown outcome
which resolution check passes now. It reads and plans; the writes are the same actions the command line uses
(``drain_worker``, ``recover_by_hand``, ``terminals.resolution.resolve``)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async as db
from django.conf import settings
from django.db.models import Count, Exists, F, OuterRef, Q
from django.db.models.functions import Now

from executions.actions import Actor
from executions.models import Execution, ExecutionEvent, Kind, State
from terminals import actions, recovery
from terminals.models import ProcessLease, Worker, WorkerEvent, WorkerState
from terminals.resolution import Check, owner_in_question, run_checks

UNKNOWNS_SHOWN = 50


def with_holdings(workers):
    """``workers`` annotated with their heartbeat's age on the database's clock (``age``) and the terminal
    sessions and commands they hold (``sessions``, ``commands``)."""
    held = Q(leases__released_at__isnull=True)
    by_hand = WorkerEvent.objects.filter(worker=OuterRef("pk"), detail__has_key="via")
    return workers.annotate(
        age=Now() - F("heartbeat_at"),
        by_hand=Exists(by_hand),
        sessions=Count("leases", filter=held & Q(leases__execution__kind=Kind.TERMINAL)),
        commands=Count("leases", filter=held & Q(leases__execution__kind=Kind.COMMAND)),
    )


class Shown(StrEnum):
    """A worker's status as the console shows it: its own state, or what its silence makes of it."""

    RUNNING = WorkerState.RUNNING.value
    DRAINING = WorkerState.DRAINING.value
    STOPPED = WorkerState.STOPPED.value
    PRESUMED_DEAD = "presumed dead"  # not stopped, and silent past its lease TTL
    RECOVERY_PASS = "recovery pass"  # a pass run by hand: no worker that ever served shells


def status_of(worker: Worker) -> Shown:
    """running, draining, stopped, or presumed dead: not stopped, and silent past its lease TTL (an annotated
    worker, see ``with_holdings``); a recovery pass run by hand (Run recovery, recover_terminals) is no worker
    that ever served shells, and says so."""
    if getattr(worker, "by_hand", False) and worker.state == WorkerState.STOPPED:
        return Shown.RECOVERY_PASS
    if worker.state != WorkerState.STOPPED and worker.age.total_seconds() > settings.TETHER_LEASE_TTL_SECONDS:
        return Shown.PRESUMED_DEAD
    return Shown(worker.state)


@dataclass
class DrainProgress:
    worker: Worker
    status: str
    drained_at: object | None  # when the drain was asked
    left: list[ProcessLease]  # leases it still holds, or left (stopped) for adoption
    adopted: list[tuple[ProcessLease, str]]  # leases it left that another worker holds now: (lease, worker id)
    ended: list[Execution]  # what it ended and recorded since the drain was asked
    left_for_adoption: int = 0  # how many leases it left when it stopped (its stop event says)

    @property
    def stopped(self) -> bool:
        return self.worker.state == WorkerState.STOPPED

    @property
    def changing_hands(self) -> int:
        """Leases it left that another worker has taken over but not yet said it adopted."""
        return max(self.left_for_adoption - len(self.left) - len(self.adopted), 0)

    @property
    def done(self) -> bool:
        """Nothing more to watch: it was asked to drain, it stopped, and what it left has been adopted."""
        return self.drained_at is not None and self.stopped and len(self.adopted) >= self.left_for_adoption


def drain_progress(worker_pk: int) -> DrainProgress:
    worker = with_holdings(Worker.objects.filter(pk=worker_pk)).get()
    asked = WorkerEvent.objects.filter(worker=worker, to_state=WorkerState.DRAINING).order_by("-at").first()
    since = asked.at if asked else worker.started_at
    left = list(
        ProcessLease.objects.select_related("execution__machine", "worker").filter(
            worker=worker, released_at__isnull=True
        )
    )
    # What it left and another worker has taken over since: the adoption event names the previous owner.
    adoptions = ExecutionEvent.objects.filter(
        evidence="adopted", at__gte=since, detail__previous_worker=worker.worker_id
    ).select_related("execution__lease__worker")
    adopted = [
        (event.execution.lease, event.actor.removeprefix("worker:"))
        for event in adoptions
        if hasattr(event.execution, "lease")
    ]
    ended = list(
        Execution.objects.filter(
            events__actor=f"worker:{worker.worker_id}",
            events__at__gte=since,
            events__to_state__in=[State.COMPLETED, State.UNKNOWN],
        )
        .select_related("machine")
        .distinct()
    )
    stop = WorkerEvent.objects.filter(worker=worker, to_state=WorkerState.STOPPED).order_by("-at").first()
    left_count = int(stop.detail.get("left_for_adoption", 0)) if stop else 0
    return DrainProgress(worker, status_of(worker), asked.at if asked else None, left, adopted, ended, left_count)


# --- recovery ------------------------------------------------------------------------------------


@dataclass
class Planned:
    """One thing a recovery pass would do, and who does it."""

    finding: recovery.Finding
    by: str  # "Run recovery" (this page, or recover_terminals), or a live worker (adoption, watching)


async def recover_by_hand(actor: Actor, via: str) -> list[str]:
    """One recovery pass by a short-lived owner of its own (every write it makes fenced like a worker's), adoption
    and watching left to live workers: what ``recover_terminals`` and the admin's Run recovery do. Who ran it
    (``actor``, ``via``) is an event of that worker's. Returns what was done."""
    from terminals.worker import OwnerWorker  # the worker's stack, only for a pass run here

    worker = OwnerWorker(backends=set(), poll_interval=1)
    await worker.start()
    try:
        done = await worker.recover_once(adopt=False)
        await db(actions.note_recovery_run)(worker.worker, actor, done, via)
        return done
    finally:
        await worker.shutdown()


def recovery_preview() -> list[Planned]:
    """What a recovery pass would do now, changing nothing (the same plan recover_terminals --dry-run prints,
    with what only a live worker does shown as such): dead owners' leases of machines on this host or on none,
    and orphaned tmux sessions."""

    async def plan() -> list[recovery.Finding]:
        return await recovery.plan(can_adopt=True, can_watch=True) + await recovery.find_orphan_sessions()

    planned = []
    for finding in async_to_sync(plan)():
        if finding.action in (recovery.Action.ADOPT, recovery.Action.WATCH):
            by = f"a live worker serving {finding.backend} on {settings.TETHER_HOST} (workers adopt and watch)"
        elif finding.action == recovery.Action.WAIT:
            by = "a later pass"
        else:
            by = "Run recovery (or any worker's next pass)"
        planned.append(Planned(finding, by))
    return planned


# --- unknown outcomes ------------------------------------------------------------------------------

NEXT_STEP = {
    "owner": "Drain the worker named (Workers → Drain), or wait until it is proven dead.",
    "machine": "Check that the machine still names what the execution ran on; put it back, or resolve on the "
    "host it lives on.",
    "process": "Make sure nothing of it runs: end the processes named, or stop or remove the container it ran "
    "in; then check again.",
    "note": "say what you saw that shows the process is gone, when you resolve it",
}


@dataclass
class UnknownRow:
    execution: Execution
    unknown_since: object
    slot_since: object  # since when it has held its machine's command slot (it was dispatched)
    checks: list[Check]
    owner_worker: Worker | None  # the worker the owner check names, when it is one to drain

    @property
    def failing(self) -> list[tuple[Check, str]]:
        """Each check that fails now (the note is the operator's, at resolve), and what to do about it."""
        return [(check, NEXT_STEP[check.name]) for check in self.checks if not check.ok and check.name != "note"]


def unknown_queue() -> list[UnknownRow]:
    """Every unknown execution, oldest first (at most UNKNOWNS_SHOWN), with each resolution check as Tether
    runs it now (the note is the operator's, at resolve)."""
    executions = Execution.objects.filter(state=State.UNKNOWN).select_related("machine").order_by("ended_at", "id")
    rows = []
    for execution in executions[:UNKNOWNS_SHOWN]:
        checks = run_checks(execution, "")
        checks[-1] = Check("note", False, NEXT_STEP["note"])
        dispatched = execution.events.filter(to_state=State.DISPATCHED).values_list("at", flat=True).first()
        lease = ProcessLease.objects.select_related("worker").filter(execution=execution).first()
        # The worker to drain is the one the owner check names (which one recorded it unknown is no matter).
        owner = owner_in_question(execution, lease) if not checks[0].ok else None
        rows.append(
            UnknownRow(
                execution=execution,
                unknown_since=execution.ended_at,
                slot_since=dispatched or execution.created_at,
                checks=checks,
                owner_worker=owner,
            )
        )
    return rows
