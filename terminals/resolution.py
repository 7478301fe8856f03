"""The resolution procedure: an ``unknown`` execution is resolved only when the system has checked, itself,
that nothing of it can still run. An operator's word is one of four checks, never enough on its own.

1. owner: the worker that held it is drained (stopped) or proven dead;
2. machine: the machine is the one it ran on (same backend reference and incarnation);
3. process: the process is proven gone (tmux session absent or its pane dead, docker exec ended and no
   host pid left, no pid with a matching start time alive, nothing carrying its session tag);
4. note: the operator says what they saw.

Any failed check refuses the resolve and names it. Two operators racing get one winner (the
transition is a compare-and-set). There is no force flag.
"""

from __future__ import annotations

import socket
from dataclasses import asdict, dataclass
from datetime import timedelta

from asgiref.sync import async_to_sync
from django.conf import settings
from django.db.models.functions import Now

from executions import actions as exec_actions
from executions.actions import Actor
from executions.errors import Refused, TransitionRefused
from executions.models import Backend as BackendKind
from executions.models import Evidence, Execution, ExecutionEvent, State
from terminals.backends import procfs
from terminals.backends.base import Status
from terminals.backends.procfs import boot_id
from terminals.backends.tmux import TmuxBackend
from terminals.models import ProcessLease, Worker, WorkerState
from terminals.recovery import owner_is_gone
from terminals.registry import backend_for


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str

    def __str__(self) -> str:
        return f"[{'ok' if self.ok else 'FAILED'}] {self.name}: {self.detail}"


class ResolveRefused(Refused):
    def __init__(self, execution: Execution, checks: list[Check]):
        self.checks = checks
        failed = ", ".join(check.name for check in checks if not check.ok)
        super().__init__(f"{execution} cannot be resolved: check failed: {failed}\n" + "\n".join(map(str, checks)))


def _session_label(execution: Execution) -> str:
    session = getattr(execution, "terminal_session", None)
    return str(session.id) if session else f"{execution.scope}/{execution.execution_id}"


def _alive_owner(worker: Worker) -> str | None:
    """Why ``worker`` cannot be trusted to have let go (None when it is stopped or proven dead)."""
    if worker.state == WorkerState.STOPPED:
        return None
    if worker.host == socket.gethostname() and worker.boot_id == boot_id():
        if owner_is_gone(worker.pid, worker.process_started_at):  # pid and start time: proof on this host
            return None
        state = f"{worker.state} (pid {worker.pid} runs)"
    else:  # another host: only its silence past the lease TTL tells
        ttl = timedelta(seconds=settings.TETHER_LEASE_TTL_SECONDS)
        if Worker.objects.filter(pk=worker.pk, heartbeat_at__lt=Now() - ttl).exists():
            return None
        state = f"{worker.state} and beating"
    return (
        f"worker {worker.worker_id[:12]} on {worker.host} is {state}: "
        f"drain it first (manage.py drain_worker {worker.worker_id[:12]})"
    )


def _last_observer(execution: Execution) -> str | None:
    """The worker that last watched the process: the one that claimed it, or the last to adopt it."""
    events = ExecutionEvent.objects.filter(execution=execution, actor__startswith="worker:")
    adopted = events.filter(evidence=Evidence.ADOPTED).order_by("-at", "-id").first()
    if adopted is not None:
        return adopted.actor.removeprefix("worker:")
    claimed = events.filter(to_state=State.DISPATCHED).first()
    return claimed.actor.removeprefix("worker:") if claimed else None


def check_owner(execution: Execution, lease: ProcessLease | None) -> Check:
    if lease is None or lease.worker is None:
        return Check("owner", True, "no worker ever held it")
    if lease.released_at is None:
        problem = _alive_owner(lease.worker)
        if problem:
            return Check("owner", False, problem)
        return Check("owner", True, f"worker {lease.worker.worker_id[:12]} holding it is stopped or proven dead")
    observer_id = _last_observer(execution)
    if observer_id is None:
        return Check("owner", True, "no worker ever observed it")
    lost = ExecutionEvent.objects.filter(execution=execution, to_state=State.UNKNOWN).first()
    if lost is not None and lost.actor == f"worker:{observer_id}":
        return Check("owner", True, f"its owner {observer_id[:12]} let go of it when it recorded the outcome unknown")
    observer = Worker.objects.filter(worker_id=observer_id).first()
    problem = _alive_owner(observer) if observer else None
    if problem:
        return Check("owner", False, problem)
    return Check("owner", True, f"its owner {observer_id[:12]} is stopped or proven dead")


def check_machine(execution: Execution) -> Check:
    machine = execution.machine
    if execution.ran_on_incarnation is None:
        return Check("machine", False, "where it ran was never recorded (it was not dispatched by a worker)")
    now = (machine.ref, machine.incarnation)
    then = (execution.ran_on_ref, execution.ran_on_incarnation)
    if now != then:
        return Check(
            "machine",
            False,
            f"machine {machine.name} is now {now[0] or 'this host'} incarnation {now[1]}; "
            f"it ran on {then[0] or 'this host'} incarnation {then[1]}",
        )
    return Check(
        "machine", True, f"{machine.name} ({machine.backend} {machine.ref or 'this host'}) incarnation {now[1]}"
    )


async def _inspect(backend, handle: dict) -> Check:
    seen = await backend.inspect(handle)
    if seen.status in (Status.GONE, Status.EXITED):
        return Check("process", True, seen.detail or (seen.exit.describe() if seen.exit else str(seen.status)))
    if seen.status == Status.ALIVE:
        return Check("process", False, f"still running: {seen.detail}")
    return Check("process", False, f"cannot look at it: {seen.detail}")


async def _search(machine, label: str) -> Check:
    """No handle was saved (the owner died mid-launch): look for anything tagged with its session."""
    if machine.backend == BackendKind.TMUX:
        tagged = [
            t
            for t in await TmuxBackend(machine.ref or settings.TETHER_TMUX_SOCKET).list_tagged()
            if t.tags["session"] == label
        ]
        if tagged:
            return Check("process", False, f"tmux session {tagged[0].handle['session']} is tagged with it")
        return Check(
            "process", True, f"no tmux session on socket {machine.ref or settings.TETHER_TMUX_SOCKET} is tagged with it"
        )
    if machine.backend == BackendKind.LOCAL:
        left = procfs.find_tree_by_session_label(label)
        if left:
            return Check("process", False, f"pid {left[0].pid} carries TETHER_SESSION={label}")
        return Check("process", True, f"no process on this host carries TETHER_SESSION={label}")
    return Check("process", False, "no handle was saved and docker cannot be searched by tag: stop the container")


def check_process(execution: Execution, lease: ProcessLease | None) -> Check:
    try:
        if lease is not None and lease.handle:
            return async_to_sync(_inspect)(backend_for(execution.machine), lease.handle)
        return async_to_sync(_search)(execution.machine, _session_label(execution))
    except Exception as error:  # an unreachable engine proves nothing
        return Check("process", False, f"cannot look at it: {error!r}")


def check_note(note: str) -> Check:
    note = (note or "").strip()
    if not note:
        return Check("note", False, "say what you saw: the evidence that the process is gone")
    return Check("note", True, note[:200])


def run_checks(execution: Execution, note: str) -> list[Check]:
    lease = ProcessLease.objects.select_related("worker").filter(execution=execution).first()
    return [check_owner(execution, lease), check_machine(execution), check_process(execution, lease), check_note(note)]


def resolve(execution: Execution, *, actor: Actor, note: str) -> tuple[Execution, list[Check]]:
    """Check everything, then unknown -> resolved (compare-and-set, the slot freed, the event naming the
    operator and the evidence). Raises ResolveRefused naming the failed checks."""
    execution = Execution.objects.select_related("machine").get(pk=execution.pk)
    if execution.state != State.UNKNOWN:
        raise TransitionRefused(str(execution), execution.state, State.RESOLVED)
    checks = run_checks(execution, note)
    if not all(check.ok for check in checks):
        raise ResolveRefused(execution, checks)
    resolved = exec_actions.resolve_execution(
        execution, actor=actor, note=note, detail={"checks": [asdict(check) for check in checks]}
    )
    return resolved, checks
