"""Execution records: identity, the command slot, guarded transitions and the audit trail."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.db import IntegrityError, connection, transaction
from django.db.models.functions import Now

from executions import actions
from executions.errors import IdentityConflict, NotFound, Refused, SlotTaken, TransitionRefused, UsageError
from executions.models import Evidence, Execution, ExecutionEvent, Kind, Machine, MachineEvent, MachineState, State
from tests.factories import TEST_ACTOR, make_execution, make_machine, make_spec, mark_resolved

pytestmark = pytest.mark.django_db


def _events(execution: Execution) -> list[tuple[str, str, str]]:
    return list(execution.events.values_list("from_state", "to_state", "evidence"))


def test_submit_records_pending_execution_holding_the_slot():
    machine = make_machine("box")
    execution = make_execution(machine, execution_id="build-1", spec=make_spec("make", "all"))
    machine.refresh_from_db()
    assert execution.state == State.PENDING
    assert execution.spec["argv"] == ["make", "all"]
    assert machine.active_execution_id == execution.pk
    assert _events(execution) == [("", State.PENDING, Evidence.SUBMITTED)]


def test_resubmitting_same_spec_returns_existing_execution_and_records_nothing():
    machine = make_machine()
    first = make_execution(machine, execution_id="job")
    again, created = actions.submit_execution(
        scope="team-a", execution_id="job", machine_name=machine.name, spec=make_spec(), actor=TEST_ACTOR
    )
    assert not created
    assert again.pk == first.pk
    assert Execution.objects.count() == 1
    assert first.events.count() == 1


def test_resubmitting_after_completion_still_returns_the_finished_record():
    machine = make_machine()
    execution = make_execution(machine, execution_id="job")
    execution = actions.transition(execution, State.DISPATCHED, evidence=Evidence.CLAIMED, actor=TEST_ACTOR)
    execution = actions.transition(execution, State.RUNNING, evidence=Evidence.OBSERVED, actor=TEST_ACTOR)
    actions.transition(execution, State.COMPLETED, evidence=Evidence.EXITED, exit_code=7, actor=TEST_ACTOR)
    again, created = actions.submit_execution(
        scope="team-a", execution_id="job", machine_name=machine.name, spec=make_spec(), actor=TEST_ACTOR
    )
    assert not created
    assert (again.state, again.exit_code) == (State.COMPLETED, 7)
    assert again.outcome_label == "Exited with code 7"


def test_different_spec_under_same_identity_is_a_conflict():
    machine = make_machine()
    make_execution(machine, execution_id="job", spec=make_spec("echo", "one"))
    with pytest.raises(IdentityConflict, match="different spec"):
        actions.submit_execution(
            scope="team-a",
            execution_id="job",
            machine_name=machine.name,
            spec=make_spec("echo", "two"),
            actor=TEST_ACTOR,
        )


def test_same_identity_on_another_machine_is_a_conflict():
    make_execution(make_machine("first"), execution_id="job")
    other = make_machine("second")
    with pytest.raises(IdentityConflict, match="already exists on machine first"):
        actions.submit_execution(
            scope="team-a", execution_id="job", machine_name=other.name, spec=make_spec(), actor=TEST_ACTOR
        )


def test_same_id_in_another_scope_is_another_execution():
    machine = make_machine()
    first = make_execution(machine, scope="team-a", execution_id="job")
    actions.transition(first, State.CANCELLED, evidence=Evidence.CANCELLED, actor=TEST_ACTOR)
    second = make_execution(machine, scope="team-b", execution_id="job")
    assert second.pk != first.pk


def test_submit_to_busy_machine_is_refused_naming_the_holder():
    machine = make_machine()
    make_execution(machine, execution_id="holder")
    with pytest.raises(SlotTaken, match=r"held by team-a/holder \(pending\)"):
        make_execution(machine, execution_id="second")
    assert not Execution.objects.filter(execution_id="second").exists()


def test_submit_to_stopped_machine_is_refused():
    machine = actions.set_machine_state(make_machine(), MachineState.STOPPED, actor=TEST_ACTOR)
    with pytest.raises(Refused, match="stopped"):
        make_execution(machine)


def test_submit_to_unknown_machine_is_not_found():
    with pytest.raises(NotFound):
        actions.submit_execution(
            scope="s", execution_id="x", machine_name="nowhere", spec=make_spec(), actor=TEST_ACTOR
        )


@pytest.mark.parametrize("bad_id", ["", " spaced", "a b", "x" * 201, "-leading"])
def test_malformed_identity_is_a_usage_error(bad_id):
    machine = make_machine()
    with pytest.raises(UsageError):
        actions.submit_execution(
            scope="team-a", execution_id=bad_id, machine_name=machine.name, spec=make_spec(), actor=TEST_ACTOR
        )


def test_full_lifecycle_stamps_each_stage_and_frees_the_slot():
    machine = make_machine()
    execution = make_execution(machine)
    execution = actions.transition(execution, State.DISPATCHED, evidence=Evidence.CLAIMED, actor=TEST_ACTOR)
    assert execution.dispatched_at is not None
    execution = actions.transition(execution, State.RUNNING, evidence=Evidence.OBSERVED, actor=TEST_ACTOR)
    assert execution.started_at is not None
    machine.refresh_from_db()
    assert machine.active_execution_id == execution.pk
    execution = actions.transition(execution, State.COMPLETED, evidence=Evidence.EXITED, exit_code=0, actor=TEST_ACTOR)
    assert execution.ended_at is not None
    machine.refresh_from_db()
    assert machine.active_execution_id is None
    assert [to for _, to, _ in _events(execution)] == ["pending", "dispatched", "running", "completed"]


def test_unknown_keeps_the_slot_until_resolved():
    machine = make_machine()
    execution = make_execution(machine)
    execution = actions.transition(execution, State.DISPATCHED, evidence=Evidence.CLAIMED, actor=TEST_ACTOR)
    execution = actions.transition(execution, State.UNKNOWN, evidence=Evidence.CONTROLLER_LOST, actor=TEST_ACTOR)
    machine.refresh_from_db()
    assert machine.active_execution_id == execution.pk
    with pytest.raises(SlotTaken, match="unknown"):
        make_execution(machine)
    with pytest.raises(SlotTaken):
        actions.set_machine_state(machine, MachineState.STOPPED, actor=TEST_ACTOR)
    with pytest.raises(SlotTaken):
        actions.set_machine_state(machine, MachineState.DELETED, actor=TEST_ACTOR)

    resolved = mark_resolved(execution, "container removed by hand")
    assert resolved.state == State.RESOLVED
    assert resolved.exit_code is None
    assert resolved.outcome_label == "Resolved: outcome unknown"
    machine.refresh_from_db()
    assert machine.active_execution_id is None
    assert actions.set_machine_state(machine, MachineState.DELETED, actor=TEST_ACTOR).state == MachineState.DELETED


def test_only_unknown_can_be_resolved_and_never_without_a_note():
    execution = make_execution()
    with pytest.raises(TransitionRefused, match="is pending; cannot move it to resolved"):
        mark_resolved(execution, "looked fine")
    execution = actions.transition(execution, State.DISPATCHED, evidence=Evidence.CLAIMED, actor=TEST_ACTOR)
    execution = actions.transition(execution, State.UNKNOWN, evidence=Evidence.CONTROLLER_LOST, actor=TEST_ACTOR)
    with pytest.raises(IntegrityError, match="execution_resolved_has_note"):
        mark_resolved(execution, "")
    execution.refresh_from_db()
    assert execution.state == State.UNKNOWN and _events(execution)[-1][1] == State.UNKNOWN


@pytest.mark.parametrize(
    ("path", "refused"),
    [
        ([], State.RUNNING),  # pending cannot skip dispatch
        ([], State.UNKNOWN),  # nothing dispatched, so the outcome is known: nothing ran
        ([State.DISPATCHED], State.CANCELLED),  # after dispatch, cancel must go through the process
        ([State.CANCELLED], State.DISPATCHED),  # final states stay final
    ],
)
def test_transitions_outside_the_table_are_refused(path, refused):
    execution = make_execution()
    for step in path:
        execution = actions.transition(execution, step, evidence=Evidence.CLAIMED, actor=TEST_ACTOR)
    with pytest.raises(TransitionRefused, match=f"is {execution.state}; cannot move it to {refused}"):
        actions.transition(execution, refused, evidence=Evidence.OBSERVED, actor=TEST_ACTOR)


def test_stale_read_loses_the_compare_and_set_and_names_current_state():
    execution = make_execution()
    stale = Execution.objects.get(pk=execution.pk)
    actions.cancel_execution(execution, actor=TEST_ACTOR)
    with pytest.raises(TransitionRefused, match="is cancelled"):
        actions.transition(stale, State.DISPATCHED, evidence=Evidence.CLAIMED, actor=TEST_ACTOR)
    assert Execution.objects.get(pk=execution.pk).events.count() == 2


def test_cancel_pending_frees_the_slot():
    machine = make_machine()
    execution = actions.cancel_execution(make_execution(machine), actor=TEST_ACTOR, reason="changed my mind")
    machine.refresh_from_db()
    assert execution.state == State.CANCELLED
    assert execution.outcome_label == "Cancelled before it ran"
    assert machine.active_execution is None


def test_aliases_resolve_to_the_same_logical_execution():
    execution = make_execution(execution_id="lifecycle-1")
    actions.add_alias(execution, "team-a", "correlation-9")
    assert actions.get_execution("team-a", "correlation-9").pk == execution.pk
    again, created = actions.submit_execution(
        scope="team-a",
        execution_id="correlation-9",
        machine_name=execution.machine.name,
        spec=make_spec(),
        actor=TEST_ACTOR,
    )
    assert not created and again.pk == execution.pk
    other = make_execution(make_machine(), execution_id="other")
    with pytest.raises(IdentityConflict):
        actions.add_alias(other, "team-a", "lifecycle-1")


def test_an_execution_can_name_its_parent():
    parent = make_execution(make_machine(), execution_id="pipeline")
    child = make_execution(make_machine(), execution_id="pipeline-step-1", parent=parent)
    assert Execution.objects.get(pk=child.pk).parent_id == parent.pk
    assert list(parent.children.values_list("execution_id", flat=True)) == ["pipeline-step-1"]
    assert Execution.objects.get(pk=parent.pk).parent_id is None


def test_machine_names_and_backends_are_checked():
    with pytest.raises(UsageError):
        actions.add_machine(name="bad name", backend="local", actor=TEST_ACTOR)
    with pytest.raises(UsageError):
        actions.add_machine(name="x", backend="vm", actor=TEST_ACTOR)
    with pytest.raises(UsageError, match="--ref"):
        actions.add_machine(name="x", backend="docker", actor=TEST_ACTOR)
    make_machine("dup")
    with pytest.raises(IdentityConflict):
        make_machine("dup")


@pytest.mark.parametrize(
    "engine", ["unix:///var/run/docker.sock", "tcp://10.0.0.5:2376", "ssh://deploy@builder", "https://dk.example:2376"]
)
def test_a_docker_machine_takes_an_engine_url(engine):
    machine = actions.add_machine(name="remote", backend="docker", ref="web", engine=engine, actor=TEST_ACTOR)
    assert Machine.objects.get(pk=machine.pk).engine == engine


@pytest.mark.parametrize(
    ("backend", "engine", "problem"),
    [
        ("local", "unix:///var/run/docker.sock", "only for docker machines, not local"),
        ("tmux", "tcp://10.0.0.5:2376", "only for docker machines, not tmux"),
        ("docker", "docker.example:2375", "is not a docker engine URL"),
        ("docker", "ftp://docker.example:21", "is not a docker engine URL"),
        ("docker", "tcp://docker.example", "is not a docker engine URL"),  # the SDK needs the port
        ("docker", "tcp://docker.example:port", "port that is not a number"),
        ("docker", "unix://", "is not a docker engine URL"),
    ],
)
def test_an_engine_url_is_refused_off_docker_or_when_it_is_not_one(backend, engine, problem):
    with pytest.raises(UsageError, match=f"--engine: .*{problem}"):
        actions.add_machine(name="remote", backend=backend, ref="web", engine=engine, actor=TEST_ACTOR)
    assert not Machine.objects.exists()


def test_machine_deleted_is_final():
    machine = actions.set_machine_state(make_machine(), MachineState.DELETED, actor=TEST_ACTOR)
    with pytest.raises(TransitionRefused):
        actions.set_machine_state(machine, MachineState.RUNNING, actor=TEST_ACTOR)
    assert list(machine.events.values_list("to_state", flat=True)) == ["running", "deleted"]


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
