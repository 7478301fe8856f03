"""Submitting, finding and moving executions.

Each transition is a compare-and-set on the state the caller last read, and writes its audit event in the
same transaction. Zero rows changed means someone else moved the record first; the caller gets a
``Refused`` naming the state it is really in.
"""

from __future__ import annotations

from django.db import IntegrityError, transaction
from django.db.models.functions import Now

from executions.actions.common import Actor, check_identity, get_machine, raise_slot_refusal
from executions.errors import IdentityConflict, NotFound, TransitionRefused, UsageError
from executions.locks import Lock, held_until_commit
from executions.models import (
    ALIASED,
    FINAL_STATES,
    SLOT_STATES,
    Evidence,
    Execution,
    ExecutionAlias,
    ExecutionEvent,
    Kind,
    Machine,
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

# --- lookups -------------------------------------------------------------------------------


def find_execution(scope: str, execution_id: str, namespace: str = "") -> Execution | None:
    """The execution named by this identity in ``namespace`` (its owner's: "user:PK", or the shared ""),
    directly or through an alias given in that namespace."""
    found = Execution.objects.select_related("machine")
    execution = found.filter(namespace=namespace, scope=scope, execution_id=execution_id).first()
    if execution is None:
        alias = (
            ExecutionAlias.objects.select_related("execution__machine")
            .filter(namespace=namespace, scope=scope, alias_id=execution_id)
            .first()
        )
        execution = alias.execution if alias else None
    return execution


def _claiming(namespace: str, scope: str, execution_id: str) -> None:
    """Inside a transaction that gives this identity a meaning (a submission, an alias): one at a time, so an
    identity never comes to name two executions (one as its own id, one as an alias)."""
    held_until_commit(Lock.IDENTITY, namespace, scope, execution_id)


def claiming(namespace: str, identities) -> None:
    """Before a transaction gives several identities a meaning (a submission with its aliases): each one's lock,
    in one order for everyone, so two producers naming each other's ids wait instead of deadlocking."""
    for scope, execution_id in sorted(set(identities)):
        _claiming(namespace, scope, execution_id)


def get_execution(scope: str, execution_id: str) -> Execution:
    execution = find_execution(scope, execution_id)
    if execution is None:
        raise NotFound(f"no execution {scope}/{execution_id}")
    return execution


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
    namespace: str = "",
) -> tuple[Execution, bool]:
    """Record a new execution and give it the machine's command slot.

    Returns ``(execution, created)``. Re-submitting the same spec to the same
    machine under the same identity returns the existing record, whatever its
    state, and dispatches nothing. Anything else under that identity is an
    ``IdentityConflict``.
    """
    check_identity(scope, "scope")
    check_identity(execution_id, "execution id")
    if kind not in Kind.values:
        raise UsageError(f"kind must be one of {', '.join(Kind.values)}")
    try:
        spec.validate()
    except SpecError as error:
        raise UsageError(str(error)) from None

    existing = find_execution(scope, execution_id, namespace)
    if existing is not None:
        return _same_submission(existing, spec, machine_name, kind), False

    machine = get_machine(machine_name)
    try:
        with transaction.atomic():
            _claiming(namespace, scope, execution_id)
            if (aliased := find_execution(scope, execution_id, namespace)) is not None:  # given as an alias meanwhile
                return _same_submission(aliased, spec, machine_name, kind), False
            execution = Execution.objects.create(
                namespace=namespace,
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
                raise_slot_refusal(machine.pk, f"submit {scope}/{execution_id}")
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
        existing = find_execution(scope, execution_id, namespace)
        if existing is not None:
            return _same_submission(existing, spec, machine_name, kind), False
        # Another submit's live execution on this machine committed while ours waited to insert
        # (execution_one_live_per_machine): the slot is taken, whichever check noticed first.
        if Execution.objects.filter(machine=machine, state__in=sorted(SLOT_STATES)).exists():
            raise_slot_refusal(machine.pk, f"submit {scope}/{execution_id}")
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


def add_alias(
    execution: Execution, scope: str, alias_id: str, *, namespace: str | None = None, actor: Actor | None = None
) -> tuple[ExecutionAlias | None, bool]:
    """Let ``scope``/``alias_id`` name ``execution`` too, in ``namespace`` (the execution's own by default): a
    lookup by it then finds the one execution, and a submission under it is a re-submission of that one.
    Returns ``(alias, created)``; the alias is None when the pair is the execution's own id. An identity that
    already names another execution is an ``IdentityConflict``. A new alias is an audit event."""
    check_identity(scope, "scope")
    check_identity(alias_id, "alias id")
    namespace = execution.namespace if namespace is None else namespace
    with transaction.atomic():
        _claiming(namespace, scope, alias_id)
        other = find_execution(scope, alias_id, namespace)
        if other is not None and other.pk != execution.pk:
            raise IdentityConflict(f"{scope}/{alias_id} already names another execution")
        if other is not None:
            existing = ExecutionAlias.objects.filter(namespace=namespace, scope=scope, alias_id=alias_id).first()
            return existing, False
        alias = ExecutionAlias.objects.create(namespace=namespace, scope=scope, alias_id=alias_id, execution=execution)
        actor = actor or Actor("system")
        record_fact(execution, actor=actor, evidence=ALIASED, reason=f"{scope}/{alias_id} names it too",
                    detail={"scope": scope, "alias": alias_id})  # fmt: skip
        return alias, True


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
