"""Recovery: settle every process whose owner worker died, and only those.

Every worker runs this at start and then every ``TETHER_RECOVERY_SECONDS``;
``manage.py recover_terminals [--dry-run]`` runs it by hand. A lease is
orphaned when it has expired (database clock) and its owner is dead: stopped,
or on this host its pid plus start time no longer names a running process
(a process stopped by SIGSTOP counts as not running; another host's worker
counts as dead once its heartbeat has expired). For each orphaned lease:

- the process still runs and the backend can attach to it (tmux, a held shell): **adopt**
  it under a new fencing token; the execution stays ``running`` with an
  ``adopted`` event;
- it still runs but cannot be adopted: a docker command is **watched** until
  docker reports its exit; anything else is ended (it can never be observed
  again) and recorded ``unknown``;
- it has exited and the exit can be read back (tmux's recorded status, docker
  exec inspect): ``completed`` with that code, the event saying where it came from;
- otherwise ``unknown`` with ``controller_lost``: the slot stays taken until an
  operator resolves it.

Then tagged tmux sessions that no unreleased lease claims and whose owner is
dead are removed. Untagged sessions, and those of a live owner, are never touched.

This module decides and looks at backends; the records change only through
``terminals.actions`` (taking a lease over, adoption, settling, release).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum

from channels.db import database_sync_to_async as db
from django.conf import settings
from django.db.models import Max, Q
from django.db.models.functions import Now

from executions.models import FINAL_STATES, Kind, Machine, MachineState, State
from executions.models import Backend as BackendKind
from terminals import actions, liveness, metrics
from terminals.backends.base import Exit, Status
from terminals.backends.handles import Handle, Launch, Unreadable
from terminals.backends.procfs import boot_id
from terminals.models import ProcessLease, Worker, WorkerState, lease_expired, lease_expiry_expression
from terminals.outcome import Outcome
from terminals.registry import backend_for, tmux_backend

log = logging.getLogger(__name__)


class Action(StrEnum):
    """What recovery does with what a dead owner left."""

    ADOPT = "adopt"  # a live tmux session or held shell: a new owner takes it, screen (or stream) and all
    WATCH = "watch"  # a running docker command: watched until docker reports its exit
    EXITED = "exited"  # the exit was read back: recorded
    NEVER_STARTED = "never_started"  # proven never started: completed, slot freed
    ENDED = "ended"  # a watched command ended on request (cancel, kill, fail), its tree proven gone
    UNKNOWN = "unknown"  # nothing trustworthy: unknown until an operator resolves it
    RELEASE = "release"  # already settled: only the lease is released
    WAIT = "wait"  # left for a later pass (or another worker)
    REMOVE = "remove"  # an orphan tmux session nobody claims: removed


@dataclass
class Finding:
    action: Action
    label: str
    backend: str
    detail: str
    lease: ProcessLease | None = None
    exit: Exit | None = None
    handle: Handle | None = None
    still_running: bool = False  # an unadoptable process that recovery must end before recording unknown

    def __str__(self) -> str:
        return f"{self.action:8} {self.label} [{self.backend}]: {self.detail}"


# --- who is dead ---------------------------------------------------------------------------


def owner_is_gone(pid: int, started_at: int) -> str | None:
    """Why the process (pid, start time) on this host is no owner any more, or None if it runs."""
    seen, why = liveness.process_seen(pid, started_at)
    if seen is liveness.Seen.FROZEN:
        return f"{why} past its lease"
    return why if seen is liveness.Seen.GONE else None


def owner_dead(worker: Worker | None) -> str | None:
    """Why this lease owner counts as dead, or None when it may still be alive (its lease has expired)."""
    judged = liveness.judge(worker)
    if judged.seen is liveness.Seen.ELSEWHERE:
        return f"{judged.why} missed its heartbeat (its pid is not visible here)"
    if judged.seen is liveness.Seen.FROZEN:
        return f"{judged.why} past its lease"
    return None if judged.seen is liveness.Seen.RUNNING else judged.why


def owner_proven_gone(worker: Worker | None) -> bool:
    """Whether the owner can do nothing more at all (liveness.Liveness.proven_gone). One that is only frozen
    (SIGSTOP) or silent on another host is fenced from its leases, but it may still carry out an unfenced step
    it was in the middle of, such as starting the program."""
    return liveness.judge(worker).proven_gone


def sibling_workers(me: Worker) -> list[tuple[int, int, int]]:
    """``(pk, pid, start time)`` of the other workers on this host (same boot) that have not stopped:
    the ones whose end a worker here can see the moment it happens."""
    return list(
        Worker.objects.filter(host=settings.TETHER_HOST, boot_id=boot_id())
        .exclude(pk=me.pk)
        .exclude(state=WorkerState.STOPPED)
        .values_list("pk", "pid", "process_started_at")
    )


def silent_workers_with_work_here(me: Worker, backends: set[str]) -> bool:
    """Whether another worker (any host) that has not stopped, but whose heartbeat no longer keeps its leases
    (database clock), holds an expired lease this worker could act on: of a machine on this host or on
    none, of a backend it serves. One query; asked every heartbeat, so such a worker's sessions are
    recovered within a beat of expiring, and again while a takeover is skipped (its row still locked)."""
    here = Q(execution__machine__host="") | Q(execution__machine__host=settings.TETHER_HOST)
    return (
        ProcessLease.objects.filter(lease_expired(), here, released_at__isnull=True)
        .filter(execution__machine__backend__in=sorted(backends), worker__lease_until__lt=Now())
        .exclude(worker=me)
        .exclude(worker__host=settings.TETHER_HOST)  # this host's workers are watched through their pidfds
        .exclude(worker__state=WorkerState.STOPPED)
        .exists()
    )


def seconds_until_leases_expire(worker_pk: int) -> float | None:
    """By the database clock: how long until the last lease this worker still holds expires (None: it
    holds none, so there is nothing to recover)."""
    left = (
        ProcessLease.objects.filter(worker_id=worker_pk, released_at__isnull=True)
        .annotate(left=lease_expiry_expression() - Now())
        .aggregate(longest=Max("left"))["longest"]
    )
    return None if left is None else max(left.total_seconds(), 0.0)


def orphaned_leases() -> list[tuple[ProcessLease, str]]:
    """Expired leases whose owner is dead, that this host may look at: those of machines on this host, and of
    machines that live on none (docker on a network engine). Another host's processes, tmux servers and
    local docker engine are not ours to look at."""
    here = Q(execution__machine__host="") | Q(execution__machine__host=settings.TETHER_HOST)
    expired = (
        ProcessLease.objects.select_related("worker", "execution", "execution__machine")
        .filter(lease_expired(), here, released_at__isnull=True)
        .order_by("id")
    )
    return [(lease, why) for lease in expired if (why := owner_dead(lease.worker))]


# --- deciding -------------------------------------------------------------------------------


async def judge_lease(lease: ProcessLease, why: str, *, can_adopt: bool, can_watch: bool) -> Finding:
    execution = lease.execution
    machine = execution.machine
    label = f"{execution.scope}/{execution.execution_id}"

    def finding(action: str, detail: str, **extra) -> Finding:
        return Finding(action, label, machine.backend, f"{detail}; owner {why}", lease=lease, **extra)

    if execution.state not in (State.DISPATCHED, State.RUNNING):
        return finding(Action.RELEASE, f"already {execution.state}")
    handle = lease.handle
    if handle is None:  # a lease from before launches were written down step by step
        return finding(Action.UNKNOWN, "dispatched but no process handle was saved: it may have started")
    if isinstance(handle, Unreadable):  # a later release's: left to a worker of that release
        return finding(Action.WAIT, f"this release cannot look at it ({handle.why})")
    if handle.launch == Launch.CLAIMED:
        return finding(Action.NEVER_STARTED, "its owner died before it asked the backend to start anything")
    backend = backend_for(machine)
    seen = await backend.look(handle)
    handle = seen.handle or handle  # from an intent: the process's own handle, when it was found
    if seen.status == Status.NEVER_STARTED:
        if not seen.fenced and not owner_proven_gone(lease.worker):
            return finding(Action.UNKNOWN, f"{seen.detail}, but its owner is not proven gone and may still start it")
        return finding(Action.NEVER_STARTED, seen.detail)
    if seen.status == Status.GONE and (left := await backend.survivors(handle)):
        # Nothing says how it ended, and children of it run on (ignoring the hang-up): end them first.
        return finding(
            Action.UNKNOWN, f"{seen.detail}, but {left} of its processes still run: ending them", handle=handle,
            still_running=True,
        )  # fmt: skip
    if seen.status == Status.ALIVE:
        if seen.held or backend.adoptable(handle):
            return finding(
                Action.ADOPT if can_adopt else Action.WAIT,
                f"{seen.detail or 'still running'}: adoptable",
                handle=handle,
            )
        if machine.backend == BackendKind.DOCKER and execution.kind == Kind.COMMAND:
            return finding(
                Action.WATCH if can_watch else Action.WAIT,
                f"{seen.detail or 'still running'}: watching for its exit",
                handle=handle,
            )
        return finding(
            Action.UNKNOWN,
            f"{seen.detail}, but no other worker can observe it: ending it",
            handle=handle,
            still_running=True,
        )
    if seen.held and seen.status == Status.EXITED and can_adopt:
        # A holder keeps the last output with the exit: adopted, the viewer sees the end and the exit.
        return finding(Action.ADOPT, f"{seen.detail}: adopting it for its last output", handle=handle)
    if seen.status == Status.EXITED:
        return finding(
            Action.EXITED, f"{seen.exit.describe()}, read back from {seen.exit.source}", exit=seen.exit, handle=handle
        )
    if seen.status == Status.GONE:
        return finding(Action.UNKNOWN, f"{seen.detail}; its exit cannot be read back", handle=handle)
    return finding(Action.WAIT, f"cannot look at it now ({seen.detail})")


def _claimed_markers() -> set[str]:
    leases = ProcessLease.objects.filter(released_at__isnull=True).only("handle")
    return {lease.handle.marker for lease in leases if lease.handle is not None}


def _tmux_sockets() -> list[str]:
    machines = Machine.objects.filter(backend=BackendKind.TMUX, host__in=["", settings.TETHER_HOST]).exclude(
        state=MachineState.DELETED
    )
    return sorted(set(machines.values_list("ref", flat=True)))


async def find_orphan_sessions() -> list[Finding]:
    """Tagged tmux sessions that no live execution claims and whose owner is dead."""
    claimed = await db(_claimed_markers)()
    found = []
    for name in await db(_tmux_sockets)():
        for tagged in await tmux_backend(name).list_tagged():
            tags = tagged.tags
            if tags["marker"] in claimed:
                continue
            try:
                why = owner_is_gone(int(tags["owner_pid"]), int(tags["owner_started_at"]))
            except ValueError:
                why = "its owner tags are unreadable"
            if why is None:
                continue  # a live worker owns it (perhaps still starting it)
            found.append(
                Finding(
                    Action.REMOVE,
                    f"tmux session {tagged.handle.session}",
                    BackendKind.TMUX,
                    f"tagged for {tags['session']}, no execution claims it, owner {why}",
                    handle=tagged.handle,
                )
            )
    return found


def _settled_holders(backends: set[str]) -> list[ProcessLease]:
    """Leases of settled executions on this host's machines of ``backends`` whose session holder is not known to
    be gone (the oldest 200 a pass)."""
    leases = ProcessLease.objects.select_related("execution__machine").filter(
        released_at__lt=Now() - timedelta(seconds=settings.TETHER_HOLDER_SWEEP_SECONDS),
        holder_ended_at__isnull=True,
        handle__has_key="holder",
        execution__state__in=sorted(FINAL_STATES),
        execution__machine__backend__in=sorted(backends),
        execution__machine__host__in=["", settings.TETHER_HOST],
    )
    return list(leases.order_by("released_at")[:200])


_running_on: set[int] = set()  # leases whose program was seen running under a final record (said once each)


async def sweep_settled_holders(backends: set[str]) -> list[str]:
    """End the session holders that outlived their execution's recorded outcome: their owner died between
    recording the exit and letting the holder go, and nothing else would come for them (one process and its
    ring each, on the host or in a container, for good). Counted in ``tether_holders_swept_total``."""
    done = []
    for lease in await db(_settled_holders)(backends):
        machine = lease.execution.machine
        backend = backend_for(machine)
        try:
            seen = await backend.inspect(lease.handle)
            if seen.status == Status.UNKNOWN:
                continue  # the engine cannot say now: the next pass looks again
            if seen.status == Status.ALIVE:
                # Its program runs on though its outcome is on record: never ended here; said, and left to staff.
                if lease.pk not in _running_on:
                    _running_on.add(lease.pk)
                    log.warning("%s is %s, but its program still runs (%s): left as it is", lease.execution,
                                lease.execution.state, seen.detail)  # fmt: skip
                continue
            if seen.held:
                await backend.remove(lease.handle, grace=1.0)
                metrics.HOLDERS_SWEPT.labels(machine.backend).inc()
                done.append(f"{lease.execution}: its session holder outlived the recorded outcome: ended")
            await db(actions.note_holder_ended)(lease.execution_id)
        except Exception as error:  # one holder that cannot be looked at or ended does not stop the others
            log.info("cannot sweep %s's session holder now (%r)", lease.execution, error)
    return done


async def plan(*, can_adopt: bool, can_watch: bool) -> list[Finding]:
    findings = []
    for lease, why in await db(orphaned_leases)():
        try:
            findings.append(await judge_lease(lease, why, can_adopt=can_adopt, can_watch=can_watch))
        except Exception as error:  # one unreachable backend must not stop the others' recovery
            log.warning("cannot judge lease %s: %r", lease.pk, error)
            findings.append(Finding(Action.WAIT, str(lease.execution), "?", f"cannot look at it now ({error!r})"))
    return findings


# --- acting: every write goes through actions ---------------------------------------------------


async def settle(finding: Finding, worker: Worker, token: int | None = None) -> str:
    """Carry out an exited, unknown or release finding, taking the lease over unless ``token`` is held already.

    Returns what was done."""
    lease = finding.lease
    token = token or await db(actions.take_over_lease)(lease, worker)
    if token is None:
        return "skipped: another worker moved first"
    if finding.action == Action.RELEASE:
        await db(actions.release_lease)(lease, worker, token)
        return "lease released"
    execution = lease.execution
    backend = backend_for(execution.machine)
    snapshot = None
    if finding.handle and backend.can_snapshot:
        try:
            snapshot = (await backend.snapshot(finding.handle)).render()
        except Exception:  # no screen left to keep; the session keeps its last one
            snapshot = None
    if finding.action in (Action.NEVER_STARTED, Action.ENDED):
        never = finding.action == Action.NEVER_STARTED
        note = f"recovery: {finding.detail}"
        outcome = Outcome.never_started(note) if never else Outcome.ended_by_recovery(note)
        await db(actions.settle_execution)(execution, outcome, worker=worker, token=token)
        return "completed: never started" if never else "completed: killed"
    if finding.action == Action.EXITED:
        exit = finding.exit
        ended = ""
        if finding.handle:
            # Before the record frees the slot: the dead pane held only the status, and nothing of the tree
            # may run on under the next command.
            try:
                await backend.remove(finding.handle, grace=0.5)
            except Exception as error:
                log.warning("could not end what is left of %s after reading its exit: %r", finding.label, error)
                ended = f"; ending what was left of it failed ({error!r}): some of it may still run"
        outcome = Outcome.read_back(exit, f"{exit.describe()}: read back from {exit.source} by recovery{ended}")
        await db(actions.settle_execution)(execution, outcome, worker=worker, token=token, snapshot=snapshot)
        return f"completed: {exit.describe()}"
    ended = ""
    if finding.still_running:
        try:
            await backend.remove(finding.handle, grace=1.0)
            ended = "; the unobservable process was ended"
        except Exception as error:
            ended = f"; ending it failed ({error!r}): it may still run"
    outcome = Outcome.unknown(f"recovery: {finding.detail}{ended}")
    await db(actions.settle_execution)(execution, outcome, worker=worker, token=token, snapshot=snapshot)
    return f"unknown (controller_lost){ended}"


async def remove_orphan(finding: Finding) -> str:
    backend = tmux_backend(finding.handle.socket)
    await backend.remove(finding.handle, grace=1.0)
    return "removed"
