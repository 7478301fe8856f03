"""Leases: claiming an execution, every write a worker makes about the process it holds, settling it, and
taking over a dead owner's lease (recovery decides when; these write it).

Fencing: a worker's writes about a process go through ``fenced()``, which locks
the lease row only if it still names this worker and token. A worker that finds
zero rows has lost the lease and must let go of the process at once.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import transaction
from django.db.models import DateTimeField, ExpressionWrapper, F, Q, Value
from django.db.models.functions import Now

from executions import actions as exec_actions
from executions.actions import Actor
from executions.models import Evidence, Execution, Machine, State
from terminals import metrics
from terminals.actions import commands
from terminals.actions.fencing import fenced
from terminals.actions.sessions import close_session, start_next_generation
from terminals.backends.handles import CLAIMED, Handle
from terminals.models import ProcessLease, TerminalSession, Worker, lease_expired
from terminals.outcome import Outcome

if TYPE_CHECKING:  # annotations only: actions never import the emulator
    from terminals.screen import LastScreen


def lease_expiry():
    """When a lease taken or extended now expires: the database clock plus the TTL, never a worker's clock."""
    ttl = timedelta(seconds=settings.TETHER_LEASE_TTL_SECONDS)
    return ExpressionWrapper(Now() + Value(ttl), output_field=DateTimeField())


def claim_next_execution(worker: Worker, backends: set[str]) -> tuple[Execution, ProcessLease] | None:
    """Take the oldest pending execution this worker can run: pending -> dispatched, with a lease (token 1).

    ``dispatched`` is written before the process starts, so a crash from here on
    leaves a record that says the command may have run.
    """
    actor = Actor.worker(worker.worker_id)
    # A machine's processes live on its host: only a worker there may start them. One with no host yet (a
    # local, tmux or socket-docker machine from before hosts were recorded) is pinned to the first to claim.
    here = Q(machine__host=worker.host) | Q(machine__host="")
    with transaction.atomic():
        execution = (
            Execution.objects.select_for_update(skip_locked=True, of=("self",))
            .select_related("machine")
            .filter(here, state=State.PENDING, machine__backend__in=sorted(backends))
            .order_by("created_at", "id")
            .first()
        )
        if execution is None:
            return None
        machine = execution.machine
        if machine.needs_host and not machine.host:
            if not Machine.objects.filter(pk=machine.pk, host="").update(host=worker.host):
                return None  # pinned elsewhere a moment ago: not ours
            exec_actions.note_machine(machine, actor, f"pinned to host {worker.host}, whose worker claimed it first")
            machine.host = worker.host
        execution = exec_actions.transition(
            execution,
            State.DISPATCHED,
            evidence=Evidence.CLAIMED,
            actor=actor,
            detail={"worker": worker.worker_id, "machine_ref": machine.ref, "incarnation": machine.incarnation},
            ran_on_ref=machine.ref,
            ran_on_incarnation=machine.incarnation,
        )
        lease = ProcessLease.objects.create(
            execution=execution,
            worker=worker,
            token=1,
            handle=CLAIMED,  # a crash from here to begin_spawn provably started nothing
            expires_at=lease_expiry(),
        )
    lease.refresh_from_db()
    return execution, lease


def fenced_transition(execution: Execution, to_state: str, *, worker: Worker, token: int, **kwargs) -> Execution:
    with fenced(execution.pk, worker, token):
        return exec_actions.transition(execution, to_state, actor=Actor.worker(worker.worker_id), **kwargs)


def save_output(execution_pk: int, worker: Worker, token: int, output: bytes, truncated: int) -> None:
    """A running command's output as its owner has seen it so far (fenced: only the owner writes it), so a
    worker lost mid-run leaves what it saw in the record. Not complete until its owner settles it."""
    with fenced(execution_pk, worker, token):
        Execution.objects.filter(pk=execution_pk).update(
            output=output, output_truncated=max(truncated, 0), output_complete=False
        )


def note_holder_ended(execution_pk: int) -> None:
    """The session holder of the execution's process is gone (let go by its owner, or ended by recovery)."""
    ProcessLease.objects.filter(execution_id=execution_pk, holder_ended_at__isnull=True).update(holder_ended_at=Now())


def save_handle(execution_pk: int, worker: Worker, token: int, handle: Handle) -> None:
    with fenced(execution_pk, worker, token):
        ProcessLease.objects.filter(execution_id=execution_pk).update(handle=handle)


def lease_follows(execution_pk: int, worker: Worker, marker: str) -> bool:
    """Whether another worker now holds this execution's process by its marker: it found (adopted, watches)
    what ``worker`` started. If not, nobody observes that process and whoever started it must end it."""
    lease = ProcessLease.objects.filter(execution_id=execution_pk, released_at__isnull=True).first()
    if lease is None or lease.handle is None:
        return False
    return lease.worker_id != worker.pk and lease.handle.marker == marker


def begin_spawn(execution: Execution, worker: Worker, token: int, intent: Handle, instance: str) -> Execution:
    """Before the backend is asked to start anything: the intent (``launch``: spawning, with the tags'
    marker) and where it will run, in one fenced transaction. Recovery reads the intent if we die next."""
    with fenced(execution.pk, worker, token):
        execution = exec_actions.record_placement(execution, instance=instance, actor=Actor.worker(worker.worker_id))
        ProcessLease.objects.filter(execution_id=execution.pk).update(handle=intent)
    return execution


def settle_execution(
    execution: Execution,
    outcome: Outcome,
    *,
    worker: Worker,
    token: int,
    snapshot: bytes | None = None,
    screen: LastScreen | None = None,
    output_offset: int = 0,
    restart_session: bool = False,
    output: bytes | None = None,
    output_truncated: int = 0,
    output_complete: bool = True,
) -> Execution:
    """Record ``outcome``, release the lease and close the session (with ``snapshot``, its output's tail, and
    ``screen``, its last screen as text):
    one fenced transaction. A command's captured ``output`` is kept with its record.

    ``restart_session`` (a reset) starts the session's next generation in the same transaction, so the
    machine's slot passes straight from the ended shell to the fresh one: a command submitted at
    that moment is refused, as it would be a moment before.
    """
    actor = Actor.worker(worker.worker_id)
    fields = dict(outcome.fields)
    if output is not None:  # the owner's capture: complete when it saw the stream to its end
        fields |= {"output": output, "output_truncated": max(output_truncated, 0), "output_complete": output_complete}
    # The execution keeps why its process was closed too: a command has no session to say so.
    close_reason = outcome.close_reason
    with fenced(execution.pk, worker, token):
        execution = exec_actions.transition(
            execution,
            outcome.state,
            evidence=outcome.evidence,
            actor=actor,
            reason=outcome.note,
            close_reason=close_reason,
            **fields,
        )
        ProcessLease.objects.filter(execution_id=execution.pk).update(released_at=Now())
        session = TerminalSession.objects.select_related("machine").filter(execution=execution).first()
        if session is not None:
            said = execution.outcome_label
            commands.end_open_commands(execution, f"the shell's session ended first ({said[:1].lower()}{said[1:]})")
            close_session(
                session,
                reason=close_reason,
                actor=actor,
                snapshot=snapshot,
                screen=screen,
                output_offset=output_offset,
            )
            # Only a proven end frees the slot for a fresh shell; unknown keeps it until resolved.
            if restart_session and execution.state == State.COMPLETED:
                start_next_generation(session, actor, close_reason)
    metrics.OUTCOMES.labels(execution.state).inc()
    return execution


# --- taking over a dead owner's lease (recovery decides; these write) -------------------------------


def take_over_lease(lease: ProcessLease, worker: Worker) -> int | None:
    """Compare-and-set an expired lease to ``worker`` with the next fencing token; None when someone else
    moved first."""
    with transaction.atomic():
        # The owner's worker row first: its heartbeat updates that row, so a beat in flight and this takeover
        # are ordered (the expiry below is read after the beat committed, or the beat's read of its leases
        # sees this takeover). A frozen owner may hold a row locked mid-transaction: skip it this pass rather
        # than wait on it (PostgreSQL ends that transaction after TETHER_DB_IDLE_TRANSACTION_SECONDS).
        if lease.worker_id is not None and not (
            Worker.objects.select_for_update(skip_locked=True).filter(pk=lease.worker_id).exists()
        ):
            return None
        row = (
            ProcessLease.objects.select_for_update(skip_locked=True, of=("self",))
            .filter(lease_expired(), pk=lease.pk, token=lease.token, released_at__isnull=True)
            .first()
        )
        if row is None:
            return None
        changed = ProcessLease.objects.filter(pk=lease.pk).update(
            worker=worker, token=F("token") + 1, covered=True, expires_at=lease_expiry()
        )
        if changed != 1:
            return None
    metrics.TAKEOVERS.inc()
    return lease.token + 1


def record_adoption(lease: ProcessLease, worker: Worker, token: int, detail: str) -> None:
    """The new owner holds the process: the execution stays running, with an ``adopted`` event."""
    actor = Actor.worker(worker.worker_id)
    facts = {"token": token, "previous_worker": lease.worker.worker_id if lease.worker else None}
    with fenced(lease.execution_id, worker, token):
        execution = lease.execution
        execution.refresh_from_db()
        if execution.state == State.DISPATCHED:  # its owner froze before it could say so: running now
            exec_actions.transition(
                execution, State.RUNNING, evidence=Evidence.ADOPTED, actor=actor, reason=detail, detail=facts
            )
            return
        exec_actions.record_fact(execution, actor=actor, evidence=Evidence.ADOPTED, reason=detail, detail=facts)


def release_lease(lease: ProcessLease, worker: Worker, token: int) -> None:
    """Let go of a lease whose execution is already settled: there is nothing left to record."""
    with fenced(lease.execution_id, worker, token):
        ProcessLease.objects.filter(pk=lease.pk).update(released_at=Now())
