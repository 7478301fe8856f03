"""The resolution procedure: an ``unknown`` execution is resolved only when the system has checked, itself,
that nothing of it can still run. An operator's word is one of four checks, never enough on its own.

1. owner: the worker that held it is drained (stopped) or proven dead;
2. machine: the machine is the one it ran on (same backend reference and incarnation);
3. process: the process is proven gone (what it ran in is gone or stopped: a removed, replaced or stopped
   container, no tmux server; else its tmux session absent or its pane dead, its docker exec ended, no pid
   with a matching start time alive; and no process of its tree left), looked at from the machine's host;
4. note: the operator says what they saw.

Any failed check refuses the resolve and names it. Two operators racing get one winner (the
transition is a compare-and-set). There is no force flag.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from asgiref.sync import async_to_sync
from django.conf import settings

from executions import actions as exec_actions
from executions.actions import Actor
from executions.errors import Refused, TransitionRefused
from executions.models import Backend, Evidence, Execution, ExecutionEvent, State
from terminals import liveness
from terminals.backends.base import Status
from terminals.backends.handles import Handle, Launch, Unreadable
from terminals.backends.procfs import MARKER_VARIABLE
from terminals.models import ProcessLease, Worker
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
    """Why ``worker`` cannot be trusted to have let go (None when it is stopped or proven dead, or on another
    host silent past the lease TTL)."""
    judged = liveness.judge(worker)
    if judged.proven_gone:
        return None
    if judged.visible_here:
        # A process stopped by SIGSTOP or a debugger is fenced from its leases, but it may go on where it
        # stopped (start a program it was about to start): it is not gone.
        state = f"{worker.state} (pid {worker.pid} {'is stopped' if judged.seen is liveness.Seen.FROZEN else 'runs'})"
    elif liveness.silent(worker):  # another host: only its silence past the lease TTL tells
        return None
    else:
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


def owner_in_question(execution: Execution, lease: ProcessLease | None) -> Worker | None:
    """The worker the owner check judges: the one holding its lease, or once the lease is released, the one
    that last watched the process (not whichever worker recorded it unknown)."""
    if lease is None or lease.worker is None:
        return None
    if lease.released_at is None:
        return lease.worker
    observer_id = _last_observer(execution)
    return Worker.objects.filter(worker_id=observer_id).first() if observer_id else None


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
    """The machine is the one it ran on: the same reference and, where it was recorded, the same object (a
    container's id, a tmux server). The object being gone is no failure: whatever ran in it ended with it,
    and the process check takes that as its proof."""
    machine = execution.machine
    if execution.ran_on_incarnation is None:
        return Check("machine", False, "where it ran was never recorded (it was not dispatched by a worker)")
    if machine.ref != execution.ran_on_ref:
        return Check(
            "machine",
            False,
            f"machine {machine.name} now names {machine.ref or 'this host'}; "
            f"it ran on {execution.ran_on_ref or 'this host'}",
        )
    if not execution.ran_on_instance:  # its owner died before it looked, or an older record: numbers only
        if machine.incarnation != execution.ran_on_incarnation:
            return Check(
                "machine",
                False,
                f"machine {machine.name} is now incarnation {machine.incarnation}; "
                f"it ran on incarnation {execution.ran_on_incarnation}",
            )
        return Check("machine", True, f"{machine.name} incarnation {machine.incarnation}")
    try:
        now = async_to_sync(backend_for(machine).instance)()
    except Exception as error:  # an unreachable engine proves nothing
        return Check("machine", False, f"cannot look at {machine.name}: {error}")
    then = execution.ran_on_instance
    if now == then:
        return Check("machine", True, f"{machine.name} is still {_short(then)} (incarnation {machine.incarnation})")
    replaced = f"replaced by {_short(now)}" if now else "gone"
    return Check("machine", True, f"{machine.name} ran it in {_short(then)}, which is {replaced}")


def _short(instance: str) -> str:
    """A container as docker prints its id, a tmux server as pid@start, a boot as it is."""
    tail = instance.rpartition("/")[2]
    if len(tail) == 64:  # ENGINE-ID/CONTAINER-ID
        return tail[:12]
    return instance.rpartition(":")[2] if instance.startswith("/") else instance  # SOCKET-PATH:pid@start


async def _inspect(backend, handle: Handle) -> Check:
    seen = await backend.look(handle)
    if seen.status in (Status.GONE, Status.EXITED, Status.NEVER_STARTED):
        return Check("process", True, seen.detail or (seen.exit.describe() if seen.exit else str(seen.status)))
    if seen.status == Status.ALIVE:
        return Check("process", False, f"still running: {seen.detail}")
    return Check("process", False, f"cannot look at it: {seen.detail}")


async def _search(backend, machine, label: str) -> Check:
    """No handle was saved (an older record): look for anything tagged with its session."""
    if backend.can_find_by_label:
        if found := await backend.find_by_label(label):
            return Check("process", False, found)
        return Check("process", True, f"nothing the {backend.name} backend can see carries session label {label}")
    return Check(
        "process",
        False,
        f"no handle was saved, so Tether cannot tell which processes in container {machine.ref!r} are its own: "
        f"stop the container (docker stop {machine.ref}) or remove it (docker rm -f {machine.ref}), "
        "then resolve again",
    )


async def _process_check(execution: Execution, handle: Handle | None, label: str) -> Check:
    """In this order: its owner never asked for it; no process of its tree is left (by its marker, whatever
    became of the machine: a child that ignores SIGHUP outlives even its tmux server); what it ran in is gone
    or stopped; else its own process, as its handle finds it."""
    machine = execution.machine
    backend = backend_for(machine)
    if isinstance(handle, Unreadable):
        return Check("process", False, f"this release cannot look at it ({handle.why}): check with a later one")
    if handle is not None and handle.launch == Launch.CLAIMED:
        return Check("process", True, "its owner never asked the backend to start it")
    if handle is not None and (marker := handle.marker) and (left := await backend.survivors(handle)):
        docker = machine.backend == Backend.DOCKER
        where = f"in container {machine.ref}" if docker else f"on {machine.host or 'its host'}"
        return Check(
            "process",
            False,
            f"{left} of its processes still run {where} (children that outlived it), each with "
            f"{MARKER_VARIABLE}={marker} in its environment (grep -l {marker} /proc/[0-9]*/environ finds them): "
            "end them, or stop the machine; then check again",
        )
    if proof := await backend.vacancy(execution.ran_on_instance):
        return Check("process", True, proof)
    if handle is not None:
        return await _inspect(backend, handle)
    return await _search(backend, machine, label)


def check_process(execution: Execution, lease: ProcessLease | None) -> Check:
    machine = execution.machine
    if machine.host and machine.host != settings.TETHER_HOST:
        return Check(
            "process",
            False,
            f"{machine.name}'s processes live on host {machine.host}: only there can Tether see them "
            f"(run exec_resolve on {machine.host})",
        )
    try:
        handle = lease.handle if lease is not None else None
        return async_to_sync(_process_check)(execution, handle, _session_label(execution))
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


def resolve(execution: Execution, *, actor: Actor, note: str, via: str = "") -> tuple[Execution, list[Check]]:
    """The only way to resolve: check everything, then unknown -> resolved (compare-and-set, the slot freed,
    the event naming the operator, the evidence and ``via`` what they did it: the admin, a command). Raises
    ResolveRefused naming the failed checks."""
    execution = Execution.objects.select_related("machine").get(pk=execution.pk)
    if execution.state != State.UNKNOWN:
        raise TransitionRefused(str(execution), execution.state, State.RESOLVED)
    checks = run_checks(execution, note)
    if not all(check.ok for check in checks):
        raise ResolveRefused(execution, checks)
    note = note.strip()
    resolved = exec_actions.transition(
        execution,
        State.RESOLVED,
        evidence=Evidence.OPERATOR_RESOLVED,  # still an unknown outcome, never a success
        actor=actor,
        reason=note,
        detail={"checks": [asdict(check) for check in checks], **({"via": via} if via else {})},
        resolution_note=note,
        resolved_by=actor.user,
    )
    return resolved, checks
