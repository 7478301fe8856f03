"""A session holder killed from outside (kill -9), in a container whose PID 1 reaps nothing (`sleep`) and on
the host: the outcome is unknown and the page is told so (4014, never "reattaching starts a fresh shell"),
what carried the session's marker is ended (a background job the hang-up did not end), the holder is not
called `running` as a zombie, resolve then succeeds, and sessions leave no zombies behind."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest
from asgiref.sync import sync_to_async

from executions.actions import Actor
from executions.models import Evidence, Execution, State
from terminals import actions
from terminals.backends.handles import Handle
from terminals.backends.procfs import find_tree
from terminals.models import ProcessLease
from terminals.protocol import CloseCode
from terminals.resolution import resolve
from tests.bridge.harness import Stack, Viewer, session_cookie

pytestmark = [pytest.mark.faults, pytest.mark.django_db(transaction=True)]


def in_container(container: str, *argv: str) -> str:
    return subprocess.run(["docker", "exec", container, *argv], capture_output=True, text=True, timeout=30).stdout


def zombies(container: str) -> int:
    return sum(line.split()[0].startswith("Z") for line in in_container(container, "ps", "-o", "stat").splitlines()[1:])


def marked_left(backend: str, handle: Handle) -> list[str]:
    """What still runs with the session's marker (docker: the sleeps, as the container's ps shows them)."""
    if backend == "docker":
        return [line for line in in_container(handle.container, "ps", "-o", "args").splitlines() if "sleep 1" in line]
    return [str(identity.pid) for identity in find_tree(marker=handle.marker)]


def kill_holder(backend: str, handle: Handle) -> None:
    if backend == "docker":
        done = subprocess.run(["docker", "exec", handle.container, "kill", "-9", str(handle.holder.pid)])
        assert done.returncode == 0
    else:
        os.kill(handle.holder.process.pid, signal.SIGKILL)


@pytest.mark.parametrize("backend", ["local", "docker"])
async def test_a_holder_killed_from_outside_ends_unknown_leaves_nothing_running_and_can_be_resolved(
    terminal, operator, backend
):
    stack = Stack()
    try:
        await sync_to_async(stack.start)(backend)
        session, cookie = await sync_to_async(terminal)(operator, backend)
        viewer = await Viewer.open(stack.ports[0], session.id, cookie)
        await viewer.attach()
        # busybox sh (docker) sends no hang-up to its jobs: the background sleep outlives the terminal.
        await viewer.type("sleep 100000 &\r")
        await viewer.type("echo READY-$((2*3)); sleep 100300\r")
        await viewer.read_until(b"READY-6")
        lease = await sync_to_async(ProcessLease.objects.get)(execution_id=session.execution_id)
        handle = lease.handle
        assert len(marked_left(backend, handle)) >= 2
        zombies_before = zombies(handle.container) if backend == "docker" else 0

        kill_holder(backend, handle)
        exit = await viewer.wait_for("exit", timeout=60)
        # Unknown, and said as such: the reason is the outcome's (it was "exited", closing with 4013).
        assert (exit["state"], exit["evidence"], exit["reason"]) == ("unknown", "controller_lost", "controller_lost")
        assert await viewer.wait_closed(timeout=20) == CloseCode.SERVER_RESTART
        again = await Viewer.open(stack.ports[0], session.id, cookie)
        await again.send_json({"type": "attach", "since": 0, "cols": 80, "rows": 24})
        assert await again.wait_closed(timeout=20) == CloseCode.SERVER_RESTART  # the same word on a reconnect

        # What carried the marker is gone (the background sleep ran on 30 s later, and resolve refused).
        deadline = time.monotonic() + 15
        while (left := marked_left(backend, handle)) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert left == []
        if backend == "docker":
            holder = handle.holder
            said = in_container(handle.container, holder.binary, "status", holder.dir).strip()
            assert said == "none" or said == "gone", said  # a zombie holder was "running"
            assert zombies(handle.container) <= zombies_before

        # The operator resolves it (the worker drained first), and the machine takes a new shell.
        await sync_to_async(stack.stop)()
        execution = await sync_to_async(Execution.objects.get)(pk=session.execution_id)
        assert (execution.state, execution.evidence) == (State.UNKNOWN, Evidence.CONTROLLER_LOST)
        resolved, checks = await sync_to_async(resolve)(
            execution, actor=Actor.for_user(operator), note="holder killed in a test; nothing left", via="test"
        )
        assert resolved.state == State.RESOLVED, checks
    finally:
        await sync_to_async(stack.stop)()


async def test_held_docker_shells_leave_no_zombie_in_a_container_whose_pid_1_reaps_nothing(operator, place):
    stack = Stack()
    try:
        await sync_to_async(stack.start)("docker")
        machine = await sync_to_async(place)("docker")
        before = zombies(machine.ref)
        for turn in range(4):
            session, _ = await sync_to_async(actions.open_terminal)(machine, operator)
            viewer = await Viewer.open(stack.ports[0], session.id, await sync_to_async(session_cookie)(operator))
            await viewer.attach()
            # A child that outlives its parent (orphaned to the holder, then reaped by it).
            await viewer.type(f"(sleep 0.1 &); echo TURN-{turn}-$((1+1)); sleep 0.3; exit 0\r")
            await viewer.wait_for("exit", timeout=30)
            await viewer.close()
            for _ in range(100):
                ended = await sync_to_async(Execution.objects.get)(pk=session.execution_id)
                if ended.state == State.COMPLETED:
                    break
                time.sleep(0.1)
        time.sleep(1)
        assert zombies(machine.ref) == before  # +13 after 10 sessions, +73 after 60, before
    finally:
        await sync_to_async(stack.stop)()
