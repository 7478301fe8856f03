"""Host affinity: a local or tmux machine's processes live on its host, and only a worker there runs, adopts or
inspects them. Two workers here report different hosts (TETHER_HOST), as on two machines."""

from __future__ import annotations

import signal
import time

import pytest

from executions import actions as exec_actions
from executions.models import Evidence, Execution, State
from terminals.models import ProcessLease, Worker
from terminals.resolution import ResolveRefused, resolve
from tests.bridge.harness import Stack, wait_for
from tests.factories import TEST_ACTOR, make_spec

pytestmark = [pytest.mark.faults, pytest.mark.django_db(transaction=True)]


def start_worker_on(stack: Stack, host: str, backends: str = "local"):
    stack.extra_env["TETHER_HOST"] = host
    return stack.start_worker(backends)


def test_only_a_worker_on_the_machines_host_runs_recovers_and_resolves_its_processes(settings):
    machine = exec_actions.add_machine(name="b-box", backend="local", host="host-b", actor=TEST_ACTOR)
    assert machine.host == "host-b"
    stack = Stack()
    stack.extra_env["TETHER_RECOVERY_SECONDS"] = "1"
    stack.extra_env["TETHER_HOLDER"] = "0"  # the worker's own PTY: it dies with the worker
    try:
        start_worker_on(stack, "host-a")
        execution, _ = exec_actions.submit_execution(
            scope="default",
            execution_id="on-b",
            machine_name=machine.name,
            spec=make_spec("sleep", "60"),
            actor=TEST_ACTOR,
        )
        time.sleep(2)  # host-a's worker polls every 0.1 s: had it claimed it, it would have by now
        assert Execution.objects.get(pk=execution.pk).state == State.PENDING

        on_b = start_worker_on(stack, "host-b")
        wait_for(lambda: Execution.objects.filter(pk=execution.pk, state=State.RUNNING).exists(), what="running on b")
        lease = ProcessLease.objects.get(execution=execution)
        assert lease.worker.host == "host-b" and lease.worker.pid == on_b.pid
        assert set(Worker.objects.values_list("host", flat=True)) == {"host-a", "host-b"}

        on_b.send_signal(signal.SIGKILL)
        on_b.wait()
        # host-a's worker sees the lease expire (and counts its owner dead once the heartbeat is old), but
        # another host's PTY is nothing it can look at: the lease is left to host-b.
        ttl = int(stack.env()["TETHER_LEASE_TTL_SECONDS"])
        time.sleep(ttl + 3)
        assert Execution.objects.get(pk=execution.pk).state == State.RUNNING
        assert ProcessLease.objects.get(execution=execution).released_at is None

        start_worker_on(stack, "host-b")
        settled = wait_for(
            lambda: Execution.objects.filter(pk=execution.pk, state=State.UNKNOWN).first(), what="settled on b"
        )
        assert settled.evidence == Evidence.CONTROLLER_LOST

        # Resolving from another host cannot see its processes: refused, naming the host. (Its dead owner
        # counts as dead there once silent past the stack's lease TTL.)
        settings.TETHER_LEASE_TTL_SECONDS = ttl
        with pytest.raises(ResolveRefused) as refused:
            resolve(settled, actor=TEST_ACTOR, note="looked from a")
        assert [check.name for check in refused.value.checks if not check.ok] == ["process"], str(refused.value)
        assert "live on host host-b" in str(refused.value)
        settings.TETHER_HOST = "host-b"
        resolved, _ = resolve(settled, actor=TEST_ACTOR, note="looked on b: the PTY died with its worker")
        assert resolved.state == State.RESOLVED
    finally:
        stack.stop()


def test_a_held_local_shell_is_adopted_by_a_worker_of_its_host_and_by_no_other():
    machine = exec_actions.add_machine(name="held-b", backend="local", host="host-b", actor=TEST_ACTOR)
    stack = Stack()
    stack.extra_env["TETHER_RECOVERY_SECONDS"] = "1"
    try:
        start_worker_on(stack, "host-a")
        on_b = start_worker_on(stack, "host-b")
        execution, _ = exec_actions.submit_execution(
            scope="default", execution_id="held-on-b", machine_name=machine.name, spec=make_spec("sleep", "60"),
            actor=TEST_ACTOR,
        )  # fmt: skip
        wait_for(lambda: Execution.objects.filter(pk=execution.pk, state=State.RUNNING).exists(), what="running")
        lease = ProcessLease.objects.get(execution=execution)
        assert lease.worker.host == "host-b" and lease.handle.holder is not None
        on_b.send_signal(signal.SIGKILL)
        on_b.wait()
        time.sleep(int(stack.env()["TETHER_LEASE_TTL_SECONDS"]) + 3)
        # host-a's worker may not look at host-b's processes: the held shell waits for its host.
        assert not execution.events.filter(evidence=Evidence.ADOPTED).exists()
        assert ProcessLease.objects.get(execution=execution).worker_id == lease.worker_id
        start_worker_on(stack, "host-b")
        wait_for(lambda: execution.events.filter(evidence=Evidence.ADOPTED).exists(), what="adopted on b")
        adopted = ProcessLease.objects.get(execution=execution, released_at__isnull=True)
        assert adopted.worker.host == "host-b" and adopted.handle.process == lease.handle.process
        assert Execution.objects.get(pk=execution.pk).state == State.RUNNING
    finally:
        stack.stop()


def test_a_docker_machine_on_a_local_socket_lives_on_its_host_and_one_on_a_network_engine_on_none(settings):
    on_socket = exec_actions.add_machine(name="sock", backend="docker", ref="c", actor=TEST_ACTOR)
    explicit = exec_actions.add_machine(
        name="unix", backend="docker", ref="c", engine="unix:///run/docker.sock", actor=TEST_ACTOR
    )
    remote = exec_actions.add_machine(
        name="remote", backend="docker", ref="c", engine="tcp://docker.example:2376", actor=TEST_ACTOR
    )
    assert (on_socket.host, explicit.host, remote.host) == (settings.TETHER_HOST, settings.TETHER_HOST, "")


def test_a_machine_from_before_hosts_is_pinned_to_the_first_worker_that_claims_its_work():
    from executions.models import Machine, MachineEvent
    from terminals import actions as terminal_actions

    machine = exec_actions.add_machine(name="legacy", backend="local", actor=TEST_ACTOR)
    Machine.objects.filter(pk=machine.pk).update(host="")  # as the migration leaves one that never ran
    exec_actions.submit_execution(
        scope="default", execution_id="first", machine_name="legacy", spec=make_spec("true"), actor=TEST_ACTOR
    )
    worker = terminal_actions.register_worker(
        worker_id="w-pin", host="host-p", pid=1, started_at=1, boot_id="b", channel_name=""
    )
    claimed, _lease = terminal_actions.claim_next_execution(worker, {"local"})
    assert claimed.execution_id == "first"
    assert Machine.objects.get(pk=machine.pk).host == "host-p"
    assert "pinned to host host-p" in MachineEvent.objects.filter(machine=machine).last().reason
