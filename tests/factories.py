"""Plain factories for test data. Each goes through actions.py, like the product does."""

from __future__ import annotations

import itertools

from executions.actions import Actor, add_machine, submit_execution, transition
from executions.models import Backend, Evidence, Execution, Machine, State
from executions.spec import ExecutionSpec

_counter = itertools.count(1)
TEST_ACTOR = Actor.command("tests")


def make_machine(
    name: str | None = None, *, backend: str = Backend.LOCAL, scope: str = "team-a", ref: str = ""
) -> Machine:
    if backend == Backend.DOCKER and not ref:
        ref = "tether-test-container"
    return add_machine(name=name or f"m{next(_counter)}", backend=backend, ref=ref, scope=scope, actor=TEST_ACTOR)


def make_spec(*argv: str, **options) -> ExecutionSpec:
    return ExecutionSpec.build(argv or ("echo", "hello"), **options)


def make_execution(
    machine: Machine | None = None, *, scope: str = "team-a", execution_id: str | None = None, spec=None, **kwargs
) -> Execution:
    machine = machine or make_machine()
    execution, _ = submit_execution(
        scope=scope,
        execution_id=execution_id or f"exec-{next(_counter)}",
        machine_name=machine.name,
        spec=spec or make_spec(),
        actor=kwargs.pop("actor", TEST_ACTOR),
        **kwargs,
    )
    return execution


def make_unknown_execution(machine: Machine, user, execution_id: str) -> Execution:
    """``user``'s command on ``machine``, committed as unknown (its worker lost): no worker ever sees it pending."""
    from django.db import transaction

    from executions.actions import Actor, transition
    from executions.models import Evidence, State

    with transaction.atomic():
        execution = make_execution(machine, execution_id=execution_id, actor=Actor.for_user(user))
        execution = transition(execution, State.DISPATCHED, evidence=Evidence.CLAIMED, actor=Actor("t"))
        return transition(execution, State.UNKNOWN, evidence=Evidence.CONTROLLER_LOST, actor=Actor("t"))


def mark_resolved(execution: Execution, note: str, actor: Actor = TEST_ACTOR) -> Execution:
    """What ``terminals.resolution.resolve`` writes once its checks pass, for tests of the records alone."""
    return transition(
        execution,
        State.RESOLVED,
        evidence=Evidence.OPERATOR_RESOLVED,
        actor=actor,
        reason=note,
        resolution_note=note,
        resolved_by=actor.user,
    )


def grant(subject, target, role: str = "use"):
    """``role`` for a user or a group on a machine (or a label, "key=value"), as staff grant it."""
    from django.contrib.auth.models import Group

    from access import actions as access_actions

    who = {"group": subject} if isinstance(subject, Group) else {"user": subject}
    where = {"label": target} if isinstance(target, str) else {"machine": target}
    return access_actions.grant(role=role, actor=TEST_ACTOR, **who, **where)[0]
