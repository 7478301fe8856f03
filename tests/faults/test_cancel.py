"""exec_cancel ends what it cancels, whoever holds it now, or says it has not: it never exits 0 having done
nothing."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from executions import actions as exec_actions
from executions.models import Evidence, Execution, State
from terminals.models import ProcessLease
from tests.backends.conftest import exec_processes
from tests.bridge.harness import Stack, wait_for
from tests.factories import TEST_ACTOR, make_spec

pytestmark = [pytest.mark.faults, pytest.mark.django_db(transaction=True)]
ROOT = Path(__file__).resolve().parents[2]


def manage(stack: Stack, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=stack.env(), capture_output=True, text=True, timeout=90
    )


@pytest.mark.parametrize("held", [False, True])
def test_cancel_ends_a_docker_command_that_a_new_worker_only_watches(place, held):
    """A plain exec (no holder) is only watched by the next worker, a held one adopted: a cancel ends either."""
    machine = place("docker")
    execution, _ = exec_actions.submit_execution(
        scope="team-a", execution_id="watched", machine_name=machine.name, spec=make_spec("sleep", "300"),
        actor=TEST_ACTOR,
    )  # fmt: skip
    stack = Stack()
    if not held:
        stack.extra_env["TETHER_HOLDER"] = "0"
    try:
        first = stack.start_worker("docker")
        wait_for(lambda: Execution.objects.filter(pk=execution.pk, state=State.RUNNING).exists(), what="running")
        first.send_signal(signal.SIGTERM)  # a clean hand-over: the command is left running
        assert first.wait(timeout=20) == 0
        second = stack.start_worker("docker")
        wait_for(
            lambda: ProcessLease.objects.filter(execution=execution, worker__pid=second.pid).exists(),
            what="the new worker to watch it",
        )
        cancelled = manage(stack, "exec_cancel", "team-a", "watched", "--wait", "20", "--json")
        assert cancelled.returncode == 0, cancelled.stderr
        data = json.loads(cancelled.stdout)
        assert (data["state"], data["evidence"]) == (State.COMPLETED, Evidence.KILLED)
        if not held:
            assert "cancel requested" in Execution.objects.get(pk=execution.pk).events.last().reason
        assert [p for p in exec_processes(machine.ref) if "sleep 300" in p] == []
    finally:
        stack.stop()


def test_cancel_that_nobody_carries_out_in_time_says_so(place):
    machine = place("local")
    execution, _ = exec_actions.submit_execution(
        scope="team-a", execution_id="frozen", machine_name=machine.name, spec=make_spec("sleep", "300"),
        actor=TEST_ACTOR,
    )  # fmt: skip
    stack = Stack()
    try:
        owner = stack.start_worker("local")
        wait_for(lambda: Execution.objects.filter(pk=execution.pk, state=State.RUNNING).exists(), what="running")
        owner.send_signal(signal.SIGSTOP)  # alive, but acting on nothing
        cancelled = manage(stack, "exec_cancel", "team-a", "frozen", "--wait", "2")
        assert cancelled.returncode == 6, cancelled.stderr
        assert "is still running; the cancel request stands" in cancelled.stderr
        owner.send_signal(signal.SIGCONT)
        done = wait_for(lambda: Execution.objects.filter(pk=execution.pk, state=State.COMPLETED).first(), 30)
        assert done.evidence == Evidence.KILLED  # the request stood, and the owner carried it out on waking
    finally:
        stack.stop()
