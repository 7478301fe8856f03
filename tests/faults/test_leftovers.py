"""After an unknown outcome is resolved, nothing of the execution may still run: not even a child that ignores
SIGHUP and outlived its program when the owner died."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from executions import actions as exec_actions
from executions.models import Evidence, Execution, State
from terminals import actions
from terminals.backends.handles import LocalHandle
from terminals.backends.procfs import MARKER_VARIABLE, ProcessIdentity
from terminals.resolution import ResolveRefused, resolve
from tests.bridge.harness import Stack, wait_for
from tests.factories import TEST_ACTOR, make_spec

pytestmark = [pytest.mark.faults, pytest.mark.django_db(transaction=True)]


@pytest.mark.parametrize(
    ("backend", "server_killed"),
    [
        ("local", False),  # no holder: the PTY dies with its owner; the child ignores the hang-up
        # A child ignoring SIGHUP outlives even `tmux kill-server`: "no tmux server" is no proof that nothing
        # of the command runs.
        ("tmux", True),
    ],
)
def test_a_dead_owners_hup_proof_child_is_ended_before_the_outcome_is_recorded(place, tmp_path, backend, server_killed):
    machine = place(backend, f"leftovers-{backend}")
    witness = tmp_path / "ran"
    script = f"(trap '' HUP; sleep 12; echo ran >> {witness}) & echo started; sleep 60"
    execution, _ = exec_actions.submit_execution(
        scope="team-a", execution_id="leftovers", machine_name=machine.name, spec=make_spec("sh", "-c", script),
        actor=TEST_ACTOR,
    )  # fmt: skip
    stack = Stack()
    stack.extra_env["TETHER_RECOVERY_SECONDS"] = "1"
    stack.extra_env["TETHER_HOLDER"] = "0"  # a held shell outlives its owner (test_worker_crash.py)
    try:
        owner = stack.start_worker(backend)
        wait_for(lambda: Execution.objects.filter(pk=execution.pk, state=State.RUNNING).exists(), what="running")
        time.sleep(0.5)  # the child is started
        owner.send_signal(signal.SIGKILL)
        owner.wait()
        if server_killed:
            subprocess.run(["tmux", "-L", machine.ref, "kill-server"], check=True)
        killed = time.monotonic()
        stack.start_worker(backend)
        settled = wait_for(lambda: Execution.objects.filter(pk=execution.pk, state=State.UNKNOWN).first(), 30)
        reason = settled.events.get(to_state=State.UNKNOWN).reason
        assert "still run" in reason and "was ended" in reason, reason
        resolved, _checks = resolve(settled, actor=TEST_ACTOR, note="owner killed; recovery ended what was left")
        assert resolved.state == State.RESOLVED
        time.sleep(max(0.0, killed + 13 - time.monotonic()))  # had the child survived, it would have written by now
        assert not witness.exists(), "a child of a resolved execution ran on"
    finally:
        stack.stop()


def test_resolve_refuses_while_any_process_of_the_tree_lives(place, dead_worker):
    marker = "leftover-marker-0123456789"
    child = subprocess.Popen(["sleep", "100"], env={**os.environ, MARKER_VARIABLE: marker}, start_new_session=True)
    try:
        gone = subprocess.Popen(["true"])
        leader = ProcessIdentity.of(gone.pid)
        gone.wait()
        machine = place("local", "tree")
        execution, _ = exec_actions.submit_execution(
            scope="team-a", execution_id="tree", machine_name=machine.name, spec=make_spec("true"), actor=TEST_ACTOR
        )
        execution, lease = actions.claim_next_execution(dead_worker, {"local"})
        actions.save_handle(execution.pk, dead_worker, lease.token, LocalHandle(process=leader, marker=marker))
        execution = actions.fenced_transition(
            execution, State.UNKNOWN, worker=dead_worker, token=lease.token, evidence=Evidence.CONTROLLER_LOST
        )
        with pytest.raises(ResolveRefused) as refused:
            resolve(execution, actor=TEST_ACTOR, note="its pid is gone")
        process = next(check for check in refused.value.checks if check.name == "process")
        assert not process.ok and "1 of its processes still run" in process.detail, process
        child.kill()
        child.wait()
        resolved, _ = resolve(execution, actor=TEST_ACTOR, note="its pid and its child are gone")
        assert resolved.state == State.RESOLVED
    finally:
        child.kill()
