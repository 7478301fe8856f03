"""Every operation that changes execution or machine state.

Each transition is a compare-and-set on the state the caller last read, and
writes its audit event in the same transaction. Zero rows changed means someone
else moved the record first; the caller gets a ``Refused`` naming the state it
is really in.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.db.models import F
from django.db.models.functions import Now

from executions.errors import IdentityConflict, NotFound, SlotTaken, TransitionRefused, UsageError
from executions.models import (
    FINAL_STATES,
    SLOT_STATES,
    Backend,
    Evidence,
    Execution,
    ExecutionAlias,
    ExecutionEvent,
    Kind,
    Machine,
    MachineEvent,
    MachineState,
    State,
)
from executions.signals import execution_submitted
from executions.spec import ExecutionSpec, SpecError

# The allowed execution transitions. Anything else is refused.
TRANSITIONS: dict[str, frozenset[str]] = {
    State.PENDING: frozenset({State.DISPATCHED, State.CANCELLED}),
    # dispatched -> completed: the process ended (or never started) before we saw it run.
    State.DISPATCHED: frozenset({State.RUNNING, State.COMPLETED, State.UNKNOWN}),
    State.RUNNING: frozenset({State.COMPLETED, State.UNKNOWN}),
    # Only once checks by the app that runs the processes prove nothing of it can still run.
    State.UNKNOWN: frozenset({State.RESOLVED}),
}

# The timestamp each state stamps when it is entered.
_STAMPS = {
    State.DISPATCHED: "dispatched_at",
    State.RUNNING: "started_at",
    State.COMPLETED: "ended_at",
    State.CANCELLED: "ended_at",
    State.UNKNOWN: "ended_at",
    State.RESOLVED: "resolved_at",
}

MACHINE_TRANSITIONS: dict[str, frozenset[str]] = {
    MachineState.RUNNING: frozenset({MachineState.STOPPED, MachineState.DELETED, MachineState.UNKNOWN}),
    MachineState.STOPPED: frozenset({MachineState.RUNNING, MachineState.DELETED, MachineState.UNKNOWN}),
    MachineState.UNKNOWN: frozenset({MachineState.RUNNING, MachineState.STOPPED, MachineState.DELETED}),
    MachineState.DELETED: frozenset(),
}

_IDENTITY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@/-]{0,199}$")


@dataclass(frozen=True)
class Actor:
    """Who asked for a change: a person, a worker or a management command."""

    label: str
    user: AbstractBaseUser | None = None

    @classmethod
    def for_user(cls, user: AbstractBaseUser) -> Actor:
        return cls(f"user:{user.get_username()}", user)

    @classmethod
    def command(cls, name: str) -> Actor:
        return cls(f"command:{name}")

    @classmethod
    def worker(cls, worker_id: str) -> Actor:
        return cls(f"worker:{worker_id}")


# --- lookups -------------------------------------------------------------------------------


def find_execution(scope: str, execution_id: str) -> Execution | None:
    """The execution named by this identity, directly or through an alias."""
    execution = Execution.objects.select_related("machine").filter(scope=scope, execution_id=execution_id).first()
    if execution is None:
        alias = (
            ExecutionAlias.objects.select_related("execution__machine")
            .filter(scope=scope, alias_id=execution_id)
            .first()
        )
        execution = alias.execution if alias else None
    return execution


def get_execution(scope: str, execution_id: str) -> Execution:
    execution = find_execution(scope, execution_id)
    if execution is None:
        raise NotFound(f"no execution {scope}/{execution_id}")
    return execution


def get_machine(name: str) -> Machine:
    try:
        return Machine.objects.select_related("active_execution").get(name=name)
    except Machine.DoesNotExist:
        raise NotFound(f"no machine named {name!r}") from None


def _check_identity(value: str, what: str) -> None:
    if not isinstance(value, str) or not _IDENTITY.match(value):
        raise UsageError(
            f"{what} {value!r} must be 1-200 characters of letters, digits and ._:@/- starting with a letter or digit"
        )


# --- submission ----------------------------------------------------------------------------


def submit_execution(
    *,
    scope: str,
    execution_id: str,
    machine_name: str,
    spec: ExecutionSpec,
    actor: Actor,
    kind: str = Kind.COMMAND,
    parent: Execution | None = None,
) -> tuple[Execution, bool]:
    """Record a new execution and give it the machine's command slot.

    Returns ``(execution, created)``. Re-submitting the same spec to the same
    machine under the same identity returns the existing record, whatever its
    state, and dispatches nothing. Anything else under that identity is an
    ``IdentityConflict``.
    """
    _check_identity(scope, "scope")
    _check_identity(execution_id, "execution id")
    if kind not in Kind.values:
        raise UsageError(f"kind must be one of {', '.join(Kind.values)}")
    try:
        spec.validate()
    except SpecError as error:
        raise UsageError(str(error)) from None

    existing = find_execution(scope, execution_id)
    if existing is not None:
        return _same_submission(existing, spec, machine_name, kind), False

    machine = get_machine(machine_name)
    try:
        with transaction.atomic():
            execution = Execution.objects.create(
                scope=scope,
                execution_id=execution_id,
                kind=kind,
                spec=spec.to_json(),
                spec_digest=spec.digest,
                machine=machine,
                parent=parent,
                requested_by=actor.user,
            )
            took = Machine.objects.filter(
                pk=machine.pk, state=MachineState.RUNNING, active_execution__isnull=True
            ).update(active_execution=execution, updated_at=Now())
            if took != 1:
                _raise_slot_refusal(machine.pk, f"submit {scope}/{execution_id}")
            ExecutionEvent.objects.create(
                execution=execution,
                from_state="",
                to_state=State.PENDING,
                evidence=Evidence.SUBMITTED,
                actor=actor.label,
                user=actor.user,
                detail={"machine": machine.name, "spec_digest": spec.digest},
            )
    except IntegrityError:
        # A concurrent submit of the same identity won the insert; answer as a re-submission.
        existing = find_execution(scope, execution_id)
        if existing is not None:
            return _same_submission(existing, spec, machine_name, kind), False
        # Another submit's live execution on this machine committed while ours waited to insert
        # (execution_one_live_per_machine): the slot is taken, whichever check noticed first.
        if Execution.objects.filter(machine=machine, state__in=sorted(SLOT_STATES)).exists():
            _raise_slot_refusal(machine.pk, f"submit {scope}/{execution_id}")
        raise
    transaction.on_commit(lambda: _announce_submission(execution))
    execution.refresh_from_db()
    return execution, True


def _announce_submission(execution: Execution) -> None:
    # After commit the submission stands: a failing receiver is logged (django.dispatch), never raised
    # into a caller that would take it for a failed submit.
    execution_submitted.send_robust(sender=Execution, execution=execution)


def _same_submission(existing: Execution, spec: ExecutionSpec, machine_name: str, kind: str) -> Execution:
    label = f"{existing.scope}/{existing.execution_id}"
    if existing.machine.name != machine_name:
        raise IdentityConflict(f"{label} already exists on machine {existing.machine.name}, not {machine_name}")
    if existing.spec_digest != spec.digest:
        raise IdentityConflict(f"{label} already exists with a different spec (digest {existing.spec_digest[:12]})")
    if existing.kind != kind:
        raise IdentityConflict(f"{label} already exists as a {existing.kind}, not a {kind}")
    return existing


def _raise_slot_refusal(machine_pk: int, doing: str) -> None:
    machine = Machine.objects.select_related("active_execution").get(pk=machine_pk)
    holder = machine.active_execution
    if holder is not None:
        raise SlotTaken(machine.name, f"{holder.scope}/{holder.execution_id}", holder.state, doing)
    raise TransitionRefused(f"machine {machine.name}", machine.state, "in use", f"cannot {doing}")


def add_alias(execution: Execution, scope: str, alias_id: str) -> ExecutionAlias:
    """Record another producer's id for ``execution``; the pair then resolves to it."""
    _check_identity(scope, "scope")
    _check_identity(alias_id, "alias id")
    other = find_execution(scope, alias_id)
    if other is not None:
        if other.pk == execution.pk:
            return ExecutionAlias.objects.get_or_create(scope=scope, alias_id=alias_id, execution=execution)[0]
        raise IdentityConflict(f"{scope}/{alias_id} already names {other.scope}/{other.execution_id}")
    try:
        with transaction.atomic():
            return ExecutionAlias.objects.create(scope=scope, alias_id=alias_id, execution=execution)
    except IntegrityError:
        raise IdentityConflict(f"{scope}/{alias_id} was claimed concurrently") from None


# --- transitions ---------------------------------------------------------------------------


def transition(
    execution: Execution,
    to_state: str,
    *,
    evidence: str,
    actor: Actor,
    reason: str = "",
    detail: dict | None = None,
    **fields,
) -> Execution:
    """Move ``execution`` from the state it was read in to ``to_state``, or raise ``Refused``.

    Steps, in one transaction:
    1. refuse a transition missing from ``TRANSITIONS``;
    2. compare-and-set the row on (pk, state as read);
    3. free the machine's slot when the new state is final;
    4. append the audit event.
    """
    label = f"{execution.scope}/{execution.execution_id}"
    from_state = execution.state
    if to_state not in TRANSITIONS.get(from_state, frozenset()):
        raise TransitionRefused(label, from_state, to_state)
    updates = {"state": to_state, "evidence": evidence, **fields}
    stamp = _STAMPS.get(to_state)
    if stamp:
        updates[stamp] = Now()
    with transaction.atomic():
        changed = Execution.objects.filter(pk=execution.pk, state=from_state).update(**updates)
        if changed != 1:
            current = Execution.objects.filter(pk=execution.pk).values_list("state", flat=True).first()
            raise TransitionRefused(label, current, to_state, "it changed while you were looking")
        if to_state in FINAL_STATES:
            Machine.objects.filter(active_execution_id=execution.pk).update(active_execution=None, updated_at=Now())
        ExecutionEvent.objects.create(
            execution=execution,
            from_state=from_state,
            to_state=to_state,
            evidence=evidence,
            actor=actor.label,
            user=actor.user,
            reason=reason,
            detail=detail or {},
        )
    execution.refresh_from_db()
    return execution


def record_fact(execution: Execution, *, actor: Actor, reason: str, evidence: str = "", detail=None) -> None:
    """An audit event that changes no state (a request to the owner, an adoption): from and to are the same."""
    ExecutionEvent.objects.create(
        execution=execution,
        from_state=execution.state,
        to_state=execution.state,
        evidence=evidence,
        actor=actor.label,
        user=actor.user,
        reason=reason,
        detail=detail or {},
    )


def cancel_execution(execution: Execution, *, actor: Actor, reason: str = "") -> Execution:
    """Cancel an execution that has not been dispatched: nothing ran, so the slot is freed."""
    return transition(execution, State.CANCELLED, evidence=Evidence.CANCELLED, actor=actor, reason=reason)


# --- machines ------------------------------------------------------------------------------


def add_machine(
    *,
    name: str,
    backend: str,
    actor: Actor,
    ref: str = "",
    scope: str = "default",
    engine: str = "",
    host: str | None = None,
) -> Machine:
    """Register a machine. One whose processes live on a host (local, tmux, docker on a unix socket) lives
    on ``host``, by default the one it is added on."""
    if not re.match(r"^[-a-zA-Z0-9_]{1,100}$", name or ""):
        raise UsageError(f"machine name {name!r} must be 1-100 letters, digits, '-' or '_'")
    if backend not in Backend.values:
        raise UsageError(f"backend must be one of {', '.join(Backend.values)}, not {backend!r}")
    _check_identity(scope, "scope")
    machine = Machine(name=name, backend=backend, ref=ref, scope=scope, engine=engine, host=host or "")
    if host is None and machine.needs_host:
        machine.host = settings.TETHER_HOST
    if problems := machine.problems():
        field, problem = next(iter(problems.items()))
        raise UsageError(f"--{field}: {problem}")
    try:
        with transaction.atomic():
            machine.save(force_insert=True)
            MachineEvent.objects.create(
                machine=machine, from_state="", to_state=machine.state, actor=actor.label, user=actor.user
            )
    except IntegrityError:
        raise IdentityConflict(f"a machine named {name!r} already exists") from None
    return machine


def note_machine(machine: Machine, actor: Actor, reason: str) -> None:
    """A machine event that changes no state (what it stands for, where it lives)."""
    MachineEvent.objects.create(
        machine=machine, from_state=machine.state, to_state=machine.state, actor=actor.label, user=actor.user,
        reason=reason,
    )  # fmt: skip


def record_placement(execution: Execution, *, instance: str, actor: Actor) -> Execution:
    """Write down which backend object ``execution`` is about to run in: the container's id, the tmux
    server (pid@start time) or the host's boot. When the machine's name now stands for another object than
    the one last seen there, the machine gets a new incarnation (with its event); resolution later compares
    what it ran in with what is there. ``instance`` "" (nothing there: the spawn will say why) changes nothing.
    """
    with transaction.atomic():
        machine = Machine.objects.select_for_update().get(pk=execution.machine_id)
        if instance and machine.instance != instance:
            replaced = bool(machine.instance)  # the first sighting replaces nothing
            Machine.objects.filter(pk=machine.pk).update(
                instance=instance, incarnation=F("incarnation") + int(replaced), updated_at=Now()
            )
            note_machine(
                machine,
                actor,
                f"{machine.backend} now {instance}"
                + (f", replacing {machine.instance}: a new incarnation" if replaced else " (first seen)"),
            )
            machine.refresh_from_db()
        if instance:
            Execution.objects.filter(pk=execution.pk).update(
                ran_on_instance=instance, ran_on_incarnation=machine.incarnation
            )
    execution.refresh_from_db()
    return execution


def set_machine_state(machine: Machine, to_state: str, *, actor: Actor, reason: str = "") -> Machine:
    """Stop, start, delete or mark a machine; stopping or deleting needs a free command slot."""
    from_state = machine.state
    if to_state not in MACHINE_TRANSITIONS.get(from_state, frozenset()):
        raise TransitionRefused(f"machine {machine.name}", from_state, to_state)
    rows = Machine.objects.filter(pk=machine.pk, state=from_state)
    if to_state in {MachineState.STOPPED, MachineState.DELETED}:
        rows = rows.filter(active_execution__isnull=True)
    with transaction.atomic():
        if rows.update(state=to_state, updated_at=Now()) != 1:
            current = Machine.objects.select_related("active_execution").filter(pk=machine.pk).first()
            if current is not None and current.state == from_state and current.active_execution is not None:
                _raise_slot_refusal(machine.pk, f"move machine {machine.name} to {to_state}")
            raise TransitionRefused(
                f"machine {machine.name}", current.state if current else None, to_state, "it changed meanwhile"
            )
        MachineEvent.objects.create(
            machine=machine, from_state=from_state, to_state=to_state, actor=actor.label, user=actor.user, reason=reason
        )
    machine.refresh_from_db()
    return machine
