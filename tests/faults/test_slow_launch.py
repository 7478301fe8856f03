"""A slow launch (a remote engine taking its time) stalls nobody: launches run beside the claim loop, and a
worker stopped meanwhile finishes them and records them before it goes.

``TETHER_FAULT_POINTS=launch.spawning:slow`` holds each launch for ``faults.SLOW_SECONDS`` right where the
backend is about to be asked to start the program, as a slow engine would.
"""

from __future__ import annotations

import asyncio
import signal
import time

import pytest

from executions import actions as exec_actions
from executions.models import Evidence, Execution, State
from terminals.models import ProcessLease
from terminals.tasks import Tasks
from tests.bridge.harness import Stack, wait_for
from tests.factories import TEST_ACTOR, make_spec

pytestmark = [pytest.mark.faults, pytest.mark.django_db(transaction=True)]


def submit(place, name: str, *argv: str) -> Execution:
    machine = place("local", name)
    execution, _ = exec_actions.submit_execution(
        scope="team-a", execution_id=name, machine_name=machine.name, spec=make_spec(*argv), actor=TEST_ACTOR
    )
    return execution


def spawning(executions: list[Execution]) -> int:
    """How many of them are at the launch step "spawning" right now (their lease's handle says so)."""
    pks = [e.pk for e in executions]
    return ProcessLease.objects.filter(execution_id__in=pks, handle__launch="spawning").count()


def test_a_slow_launch_does_not_hold_up_the_next(place):
    stack = Stack()
    stack.extra_env["TETHER_FAULT_POINTS"] = "launch.spawning:slow"
    try:
        stack.start_worker("local")
        executions = [submit(place, f"slow-{n}", "sh", "-c", f"echo {n}") for n in range(3)]
        # One launch at a time could never have two of them waiting on the engine at once.
        wait_for(lambda: spawning(executions) == 3, timeout=20, what="three launches waiting on the engine at once")
        for execution in executions:
            done = wait_for(
                lambda pk=execution.pk: Execution.objects.filter(pk=pk, state=State.COMPLETED).first(),
                timeout=30,
                what=f"{execution} to complete",
            )
            assert (done.evidence, done.exit_code) == (Evidence.EXITED, 0)
    finally:
        stack.stop()


def test_a_worker_stopped_mid_launch_finishes_it_and_records_it(place):
    stack = Stack()
    stack.extra_env["TETHER_FAULT_POINTS"] = "launch.spawning:slow"
    try:
        owner = stack.start_worker("local")
        execution = submit(place, "slow-stop", "sleep", "1000")
        wait_for(lambda: spawning([execution]) == 1, timeout=20, what="the launch to wait on the engine")
        stopped_at = time.monotonic()
        owner.send_signal(signal.SIGTERM)
        assert owner.wait(timeout=60) == 0
        # The launch was finished, not dropped: the program runs, held, with its handle written and its
        # state running, so the next worker adopts it and nothing is left dispatched for recovery to guess at.
        execution.refresh_from_db()
        assert execution.state == State.RUNNING
        lease = ProcessLease.objects.get(execution=execution)
        assert lease.handle.holder is not None and lease.handle.started
        program = lease.handle.process
        assert program.is_alive()
        program.signal(signal.SIGKILL)
        assert time.monotonic() - stopped_at < 60
    finally:
        stack.stop()


async def test_one_failing_task_leaves_the_others_running():
    """A worker's tasks run in one task group: a failure in one session's task must not cancel the group
    (and with it every other session's supervision)."""
    owner = Tasks()
    finished = []

    async def fails():
        raise RuntimeError("one session's bad luck")

    async def supervises():
        await asyncio.sleep(0.2)
        finished.append("supervisor")

    async with asyncio.TaskGroup() as group:
        owner.group = group
        owner.start(fails())
        owner.start(supervises())
    assert finished == ["supervisor"]
