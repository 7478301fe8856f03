"""Execution records: the invariants the database itself holds, and a change that commits with its audit
event or not at all."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.db import IntegrityError, connection, transaction
from django.db.models.functions import Now

from executions import actions
from executions.models import Evidence, Execution, ExecutionEvent, Kind, Machine, MachineEvent, MachineState, State
from tests.factories import TEST_ACTOR, make_execution, make_machine, make_spec, mark_resolved

pytestmark = pytest.mark.django_db


def _events(execution: Execution) -> list[tuple[str, str, str]]:
    return list(execution.events.values_list("from_state", "to_state", "evidence"))


# --- invariants held by the database itself --------------------------------------------------


def _violates(constraint: str, **updates) -> None:
    """A raw write of ``updates`` is refused by ``constraint`` itself, not by some other check."""
    execution = make_execution()
    with pytest.raises(IntegrityError, match=constraint), transaction.atomic():
        Execution.objects.filter(pk=execution.pk).update(**updates)


def test_database_refuses_completed_without_evidence():
    _violates("execution_completed_has_evidence", state=State.COMPLETED, evidence="", ended_at=Now())


@pytest.mark.parametrize(
    ("state", "required"),
    [
        (State.COMPLETED, {"evidence": Evidence.EXITED, "exit_code": 0}),
        (State.CANCELLED, {"evidence": Evidence.CANCELLED}),
        (State.UNKNOWN, {"evidence": Evidence.CONTROLLER_LOST}),
        (State.RESOLVED, {"evidence": Evidence.OPERATOR_RESOLVED, "resolved_at": Now(), "resolution_note": "gone"}),
    ],
)
def test_database_refuses_an_ended_state_without_an_end_time(state, required):
    _violates("execution_ended_has_end_time", state=state, **required)
    # The same write with an end time is accepted: the end time was all that was missing.
    execution = Execution.objects.get()
    assert Execution.objects.filter(pk=execution.pk).update(state=state, ended_at=Now(), **required) == 1


def test_database_refuses_exit_code_without_exited_evidence():
    _violates("execution_exit_code_only_when_exited", exit_code=3, evidence=Evidence.KILLED)
    _violates("execution_exited_has_exit_code", evidence=Evidence.EXITED)


def test_database_refuses_two_machines_sharing_one_active_execution():
    execution = make_execution()
    other = make_machine()
    with pytest.raises(IntegrityError), transaction.atomic():
        Machine.objects.filter(pk=other.pk).update(active_execution=execution)


def test_audit_events_are_append_only():
    event = make_execution().events.get()
    event.reason = "rewritten"
    with pytest.raises(Exception, match="append-only"):
        event.save()
    with pytest.raises(Exception, match="append-only"):
        event.delete()
    # Bypassing the model still hits the PostgreSQL trigger.
    with pytest.raises(Exception, match="append-only"), transaction.atomic():
        ExecutionEvent.objects.filter(pk=event.pk).update(reason="rewritten")
    with pytest.raises(Exception, match="append-only"), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("DELETE FROM executions_executionevent WHERE id = %s", [event.pk])
    assert ExecutionEvent.objects.get(pk=event.pk).reason == ""


@pytest.mark.parametrize(
    ("field", "column", "new_value"),
    [
        ("scope", "scope", lambda: "team-b"),
        ("execution_id", "execution_id", lambda: "renamed"),
        ("kind", "kind", lambda: Kind.TERMINAL),
        ("machine", "machine_id", lambda: make_machine()),
        ("spec", "spec", lambda: make_spec("rm", "-rf", "/tmp/x").to_json()),
        ("spec_digest", "spec_digest", lambda: "0" * 64),
    ],
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_what_an_execution_is_cannot_be_rewritten(field, column, new_value):
    execution = make_execution()
    fixed = ["scope", "execution_id", "kind", "machine_id", "spec", "spec_digest"]
    before = Execution.objects.values(*fixed).get(pk=execution.pk)
    # Bypassing actions.py with a raw update still hits the PostgreSQL trigger.
    with pytest.raises(IntegrityError, match=f"{column} is immutable"), transaction.atomic():
        Execution.objects.filter(pk=execution.pk).update(**{field: new_value()})
    assert Execution.objects.values(*fixed).get(pk=execution.pk) == before


def test_an_execution_still_moves_while_its_spec_stays_fixed():
    execution = make_execution()
    with pytest.raises(IntegrityError, match="spec is immutable"), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("UPDATE executions_execution SET spec = '{}'::jsonb WHERE id = %s", [execution.pk])
    # Everything else on the row (state, stamps, where it ran) still changes as before.
    dispatched = actions.transition(
        execution, State.DISPATCHED, evidence=Evidence.CLAIMED, actor=TEST_ACTOR, ran_on_ref="c1", ran_on_incarnation=1
    )
    assert (dispatched.state, dispatched.ran_on_ref, dispatched.spec) == (State.DISPATCHED, "c1", execution.spec)


# --- a state change and its audit event commit together or not at all ------------------------


class AuditWriteFailed(Exception):
    pass


@contextmanager
def audit_insert_fails(model: type = ExecutionEvent) -> Iterator[None]:
    """Every insert of ``model`` raises, inside whichever transaction the action opened."""

    def refuse(self, *args, **kwargs):
        raise AuditWriteFailed(f"{model.__name__} insert failed")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(model, "save", refuse)
        yield


_AS_STORED = ["state", "evidence", "exit_code", "dispatched_at", "ended_at", "resolved_at", "resolution_note"]


def _to_unknown(execution: Execution) -> Execution:
    execution = actions.transition(execution, State.DISPATCHED, evidence=Evidence.CLAIMED, actor=TEST_ACTOR)
    return actions.transition(execution, State.UNKNOWN, evidence=Evidence.CONTROLLER_LOST, actor=TEST_ACTOR)


def _dispatch(execution: Execution) -> Execution:
    return actions.transition(execution, State.DISPATCHED, evidence=Evidence.CLAIMED, actor=TEST_ACTOR)


@pytest.mark.django_db(transaction=True)  # real commits: no test-wide transaction hides a half-written change
@pytest.mark.parametrize(
    ("prepare", "operation"),
    [
        (lambda e: e, _dispatch),
        (lambda e: e, lambda e: actions.cancel_execution(e, actor=TEST_ACTOR, reason="not needed")),
        (
            _dispatch,
            lambda e: actions.transition(e, State.COMPLETED, evidence=Evidence.EXITED, exit_code=0, actor=TEST_ACTOR),
        ),
        (_to_unknown, lambda e: mark_resolved(e, "container removed")),
    ],
    ids=["dispatch", "cancel", "complete", "resolve"],
)
def test_a_transition_whose_event_cannot_be_written_changes_nothing(prepare, operation):
    machine = make_machine()
    execution = prepare(make_execution(machine))
    before = Execution.objects.values(*_AS_STORED).get(pk=execution.pk)
    events = _events(execution)
    with audit_insert_fails(), pytest.raises(AuditWriteFailed):
        operation(execution)
    assert Execution.objects.values(*_AS_STORED).get(pk=execution.pk) == before
    assert _events(execution) == events
    machine.refresh_from_db()
    assert machine.active_execution_id == execution.pk  # a final state's slot release was rolled back too


@pytest.mark.django_db(transaction=True)
def test_a_transition_whose_event_detail_cannot_be_stored_changes_nothing():
    machine = make_machine()
    execution = make_execution(machine)
    with pytest.raises(TypeError, match="not JSON serializable"):
        actions.transition(
            execution, State.CANCELLED, evidence=Evidence.CANCELLED, actor=TEST_ACTOR, detail={"at": object()}
        )
    assert Execution.objects.get(pk=execution.pk).state == State.PENDING
    assert Machine.objects.get(pk=machine.pk).active_execution_id == execution.pk


@pytest.mark.django_db(transaction=True)
def test_a_submit_whose_event_cannot_be_written_leaves_no_execution_and_a_free_slot():
    machine = make_machine()
    with audit_insert_fails(), pytest.raises(AuditWriteFailed):
        make_execution(machine, execution_id="lost")
    assert not Execution.objects.exists()
    machine.refresh_from_db()
    assert machine.active_execution_id is None
    # Nothing half-written stands in the way: the same submit goes through once events can be written.
    assert make_execution(machine, execution_id="lost").events.count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_machine_change_whose_event_cannot_be_written_changes_nothing():
    with audit_insert_fails(MachineEvent), pytest.raises(AuditWriteFailed):
        make_machine("never")
    assert not Machine.objects.exists()
    machine = make_machine("box")
    with audit_insert_fails(MachineEvent), pytest.raises(AuditWriteFailed):
        actions.set_machine_state(machine, MachineState.STOPPED, actor=TEST_ACTOR)
    machine.refresh_from_db()
    assert machine.state == MachineState.RUNNING
    assert list(machine.events.values_list("to_state", flat=True)) == [MachineState.RUNNING]
