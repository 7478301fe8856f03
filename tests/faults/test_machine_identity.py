"""A machine's name stands for one backend object at a time: its incarnation follows the container (or the
tmux server) a dispatch found there, and what became of that object is proof for resolution."""

from __future__ import annotations

import asyncio
import subprocess
import time
import uuid

import pytest
from asgiref.sync import async_to_sync, sync_to_async

from executions import actions as exec_actions
from executions.models import Evidence, Execution, Machine, MachineEvent, State
from terminals import actions
from terminals.backends.docker import DockerBackend
from terminals.registry import backend_for
from terminals.resolution import ResolveRefused, resolve
from terminals.worker import OwnerWorker
from tests.factories import TEST_ACTOR, make_spec

pytestmark = [pytest.mark.faults, pytest.mark.django_db(transaction=True)]


def run_command(machine: Machine, execution_id: str, *argv: str) -> Execution:
    """Submit and run one command to its end with a worker in this process."""

    async def run() -> Execution:
        execution, _ = await sync_to_async(exec_actions.submit_execution)(
            scope="team-a",
            execution_id=execution_id,
            machine_name=machine.name,
            spec=make_spec(*argv),
            actor=TEST_ACTOR,
        )
        worker = OwnerWorker(backends={machine.backend})
        await worker.start()
        try:
            assert await worker.handle_one_step()
            deadline = time.monotonic() + 30
            while (done := await sync_to_async(Execution.objects.get)(pk=execution.pk)).state != State.COMPLETED:
                assert time.monotonic() < deadline, done.state
                await asyncio.sleep(0.05)
            return done
        finally:
            await worker.shutdown()

    return async_to_sync(run)()


def docker(*args: str) -> str:
    done = subprocess.run(["docker", *args], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.fixture
def named_container():
    """A container that a stop leaves in place (no --rm), so it can be stopped, removed and re-created."""
    name = f"tether-test-{uuid.uuid4().hex[:8]}"
    options = ["--network", "none", "--label", "tether.test=1", "--name", name]

    def create() -> str:
        return docker("run", "-d", *options, "tether/busybox:test", "sleep", "2147483647")

    create()
    yield name, create
    subprocess.run(["docker", "rm", "-f", name], capture_output=True)


def lost_without_a_handle(machine_name: str, ref: str, dead_worker, execution_id: str) -> Execution:
    """A docker execution whose owner died before it saved any handle (an older record's shape): unknown."""
    machine = exec_actions.add_machine(name=machine_name, backend="docker", ref=ref, scope="team-a", actor=TEST_ACTOR)
    execution, _ = exec_actions.submit_execution(
        scope="team-a",
        execution_id=execution_id,
        machine_name=machine.name,
        spec=make_spec("sleep", "9"),
        actor=TEST_ACTOR,
    )
    execution, lease = actions.claim_next_execution(dead_worker, {"docker"})
    execution = exec_actions.record_placement(
        execution, instance=async_to_sync(DockerBackend(container=ref).instance)(), actor=TEST_ACTOR
    )
    actions.save_handle(execution.pk, dead_worker, lease.token, {})
    return actions.fenced_transition(
        execution, State.UNKNOWN, worker=dead_worker, token=lease.token, evidence=Evidence.CONTROLLER_LOST
    )


def test_a_docker_unknown_without_a_handle_is_resolved_by_a_stopped_removed_or_replaced_container(
    named_container,
    dead_worker,
):
    name, create = named_container
    running = lost_without_a_handle("held-1", name, dead_worker, "lost-1")
    with pytest.raises(ResolveRefused) as refused:
        resolve(running, actor=TEST_ACTOR, note="looked")
    process = next(check for check in refused.value.checks if check.name == "process")
    assert not process.ok
    # The refusal says exactly which proof would do.
    assert f"docker stop {name}" in process.detail and f"remove it (docker rm -f {name})" in process.detail

    docker("stop", "-t", "0", name)
    resolved, checks = resolve(running, actor=TEST_ACTOR, note="container stopped")
    assert resolved.state == State.RESOLVED
    assert "is stopped" in next(c for c in checks if c.name == "process").detail

    docker("start", name)
    removed = lost_without_a_handle("held-2", name, dead_worker, "lost-2")
    docker("rm", "-f", name)
    resolved, checks = resolve(removed, actor=TEST_ACTOR, note="container removed")
    assert resolved.state == State.RESOLVED
    assert "gone" in next(c for c in checks if c.name == "machine").detail

    create()
    replaced = lost_without_a_handle("held-3", name, dead_worker, "lost-3")
    first_id = replaced.ran_on_instance.rpartition("/")[2]
    docker("rm", "-f", name)
    second_id = create()
    resolved, checks = resolve(replaced, actor=TEST_ACTOR, note="container re-created")
    assert resolved.state == State.RESOLVED
    machine_check = next(c for c in checks if c.name == "machine")
    assert f"{first_id[:12]}, which is replaced by {second_id[:12]}" in machine_check.detail
    for execution in (running, removed, replaced):
        assert Machine.objects.get(pk=execution.machine_id).active_execution_id is None

    # Renamed and replaced under the name, the old container still runs what it ran: no proof at all.
    renamed = lost_without_a_handle("held-4", name, dead_worker, "lost-4")
    docker("rename", name, f"{name}-old")
    try:
        create()
        with pytest.raises(ResolveRefused) as refused:
            resolve(renamed, actor=TEST_ACTOR, note="a new container has the name")
        assert {check.name for check in refused.value.checks if not check.ok} == {"process"}
    finally:
        subprocess.run(["docker", "rm", "-f", f"{name}-old"], capture_output=True)
    resolved, _ = resolve(renamed, actor=TEST_ACTOR, note="the old container is removed now")
    assert resolved.state == State.RESOLVED


def test_an_unknown_looked_at_from_another_engine_is_no_proof(named_container, dead_worker):
    name, _create = named_container
    lost = lost_without_a_handle("far-1", name, dead_worker, "far-1")
    container_id = lost.ran_on_instance.rpartition("/")[2]
    Execution.objects.filter(pk=lost.pk).update(ran_on_instance=f"ANOTHER:ENGINE/{container_id}")
    docker("rm", "-f", name)  # gone from this engine; it ran on another one
    with pytest.raises(ResolveRefused) as refused:
        resolve(Execution.objects.get(pk=lost.pk), actor=TEST_ACTOR, note="not here")
    process = next(check for check in refused.value.checks if check.name == "process")
    assert "not ANOTHER:ENG" in process.detail and "where it ran" in process.detail


def test_a_re_created_container_is_a_new_incarnation_of_its_machine(named_container):
    name, create = named_container
    machine = exec_actions.add_machine(name="box", backend="docker", ref=name, scope="team-a", actor=TEST_ACTOR)
    first = run_command(machine, "before", "true")
    machine.refresh_from_db()
    first_id = docker("inspect", "-f", "{{.Id}}", name)
    assert machine.instance.endswith(f"/{first_id}") and machine.incarnation == 1  # ENGINE-ID/CONTAINER-ID
    assert (first.ran_on_instance, first.ran_on_incarnation) == (machine.instance, 1)

    docker("rm", "-f", name)
    second_id = create()
    second = run_command(machine, "after", "true")
    machine.refresh_from_db()
    assert machine.instance.endswith(f"/{second_id}") and machine.incarnation == 2
    assert (second.ran_on_instance, second.ran_on_incarnation) == (machine.instance, 2)
    event = MachineEvent.objects.filter(machine=machine).last()
    assert f"{first_id}: a new incarnation" in event.reason and event.actor.startswith("worker:")


def test_a_restarted_tmux_server_is_a_new_incarnation_of_its_machine(place):
    machine = place("tmux")
    first = run_command(machine, "before", "true")
    subprocess.run(["tmux", "-L", machine.ref, "kill-server"], check=True)
    second = run_command(machine, "after", "true")
    machine.refresh_from_db()
    assert first.ran_on_instance != second.ran_on_instance
    assert "@" in second.ran_on_instance
    assert (first.ran_on_incarnation, second.ran_on_incarnation, machine.incarnation) == (1, 2, 2)


def test_a_tmux_unknown_seen_through_another_socket_path_is_no_proof(place, dead_worker, monkeypatch, tmp_path):
    """Run as another user, or with another TMUX_TMPDIR, tmux finds no server: that is no proof it is gone."""
    machine = place("tmux")
    run_command(machine, "places-it", "true")  # a server on the workers' socket, recorded as the instance
    execution, _ = exec_actions.submit_execution(
        scope="team-a", execution_id="lost", machine_name=machine.name, spec=make_spec("sleep", "9"), actor=TEST_ACTOR
    )
    execution, lease = actions.claim_next_execution(dead_worker, {"tmux"})
    instance = async_to_sync(backend_for(machine).instance)()
    execution = exec_actions.record_placement(execution, instance=instance, actor=TEST_ACTOR)
    actions.save_handle(execution.pk, dead_worker, lease.token, {})
    execution = actions.fenced_transition(
        execution, State.UNKNOWN, worker=dead_worker, token=lease.token, evidence=Evidence.CONTROLLER_LOST
    )
    monkeypatch.setenv("TMUX_TMPDIR", str(tmp_path))  # this process would look somewhere else
    with pytest.raises(ResolveRefused) as refused:
        resolve(execution, actor=TEST_ACTOR, note="no server here")
    process = next(check for check in refused.value.checks if check.name == "process")
    assert "look as the workers' user" in process.detail
    monkeypatch.delenv("TMUX_TMPDIR")
    resolved, _ = resolve(execution, actor=TEST_ACTOR, note="no session is tagged with it")
    assert resolved.state == State.RESOLVED
