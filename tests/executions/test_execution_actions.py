"""Execution records: identity, the command slot, guarded transitions and the audit trail."""

from __future__ import annotations

import pytest
from django.db import IntegrityError

from executions import actions
from executions.errors import IdentityConflict, NotFound, Refused, SlotTaken, TransitionRefused, UsageError
from executions.models import Evidence, Execution, Machine, MachineState, State
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
