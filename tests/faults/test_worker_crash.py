"""An owner worker dies mid-command (kill -9) and another takes over: every outcome stays honest.

tmux keeps the shell, so it is adopted and its real exit recorded; docker keeps the exec, so its exit is
read back; a local PTY dies with its owner, so the outcome is unknown until an operator resolves it.
In no case is the command run twice or recorded as failed.
"""

from __future__ import annotations

import asyncio
import base64
import signal
import subprocess
import time

import pytest

from executions import actions as exec_actions
from executions.models import Evidence, Execution, ExecutionEvent, State
from terminals.models import ProcessLease
from terminals.resolution import resolve
from tests.bridge.harness import Stack, wait_for
from tests.factories import TEST_ACTOR, make_spec

pytestmark = [pytest.mark.faults, pytest.mark.django_db(transaction=True)]


def execution_in(pk: int, *states: str):
    execution = Execution.objects.get(pk=pk)
    return execution if execution.state in states else None


def _handle_saved(pk: int) -> bool:
    lease = ProcessLease.objects.filter(execution_id=pk, released_at=None).first()
    return bool(lease and lease.handle is not None and lease.handle.started)


def crash_stack() -> Stack:
    stack = Stack()
    stack.extra_env["TETHER_RECOVERY_SECONDS"] = "1"
    return stack


class Place:
    """Where the command's file lives: a host path, or a path inside the test container."""

    def __init__(self, backend: str, tmp_path, container: str | None):
        self.backend, self.container = backend, container
        self.path = "/tmp/launches" if container else str(tmp_path / "launches")

    def read(self) -> str:
        if self.container:
            done = subprocess.run(["docker", "exec", self.container, "cat", self.path], capture_output=True, text=True)
            return done.stdout
        try:
            with open(self.path) as f:
                return f.read()
        except FileNotFoundError:
            return ""


@pytest.mark.parametrize("variant", ["tmux", "docker", "docker-plain", "local", "local-plain"])
def test_kill_9_mid_command_then_a_new_worker_settles_it_honestly(variant, place, request, tmp_path):
    """Held commands (local and docker: the session holder keeps them) and tmux ones are adopted and finished
    by the next worker with their real exit; a plain docker exec is watched until docker reports its exit;
    a local one the worker held itself (no holder) is unknown."""
    backend = variant.removesuffix("-plain")
    machine = place(backend, f"crash-{variant}")
    where = Place(backend, tmp_path, machine.ref if backend == "docker" else None)
    spec = make_spec("sh", "-c", f"echo start >> {where.path}; sleep 5; echo done >> {where.path}")
    execution, _ = exec_actions.submit_execution(
        scope="team-a", execution_id=f"crash-{variant}", machine_name=machine.name, spec=spec, actor=TEST_ACTOR
    )
    stack = crash_stack()
    if variant.endswith("-plain"):
        stack.extra_env["TETHER_HOLDER"] = "0"
    try:
        first = stack.start_worker(backend)
        wait_for(lambda: "start" in where.read(), what="the command to start")
        # Mid-command: once its worker has written down where it runs. Before that is the launch window, whose
        # honest outcome is another (tests/faults/test_launch_window.py); under a full run's load it can outlast
        # the program's first line (seen once: unknown, "no handle was saved").
        wait_for(lambda: _handle_saved(execution.pk), what="its handle on record")
        first.send_signal(signal.SIGKILL)
        first.wait()
        stack.start_worker(backend)

        if variant == "local-plain":
            # The PTY died with its owner: nothing can say how the command ended.
            settled = wait_for(lambda: execution_in(execution.pk, State.UNKNOWN), what="unknown")
            assert settled.evidence == Evidence.CONTROLLER_LOST
            time.sleep(6)  # had the command survived, it would have written "done" by now
            assert where.read() == "start\n"
            resolved, checks = resolve(settled, actor=TEST_ACTOR, note="worker killed; PTY gone")
            assert resolved.state == State.RESOLVED and all(check.ok for check in checks)
            assert resolved.outcome_label == "Resolved: outcome unknown"
        else:
            settled = wait_for(lambda: execution_in(execution.pk, State.COMPLETED, State.UNKNOWN), 40, "settled")
            assert (settled.state, settled.evidence, settled.exit_code) == (State.COMPLETED, Evidence.EXITED, 0)
            assert where.read() == "start\ndone\n"  # ran once, to the end
            events = ExecutionEvent.objects.filter(execution=settled)
            final = events.get(to_state=State.COMPLETED)
            if variant in ("tmux", "local", "docker"):
                assert events.filter(evidence=Evidence.ADOPTED).exists(), list(events.values_list("evidence"))
                assert final.actor != events.get(to_state=State.DISPATCHED).actor  # recorded by the new owner
            else:
                assert "docker exec inspect" in final.reason
        assert not ProcessLease.objects.filter(execution=execution, released_at__isnull=True).exists()
        assert where.read().count("start") == 1
    finally:
        stack.stop()


async def test_a_viewer_follows_its_tmux_shell_to_the_adopting_worker(terminal, operator):
    """kill -9 the owner while a browser is attached: the next worker adopts the shell, and the same page
    (same socket) is re-attached to the same shell, with the screen redrawn, and can type on."""
    from asgiref.sync import sync_to_async

    from tests.bridge.harness import Viewer

    stack = crash_stack()
    stack.extra_env["TETHER_VIEWER_CHECK_SECONDS"] = "1"
    try:
        await sync_to_async(stack.start_daphne)()
        first = await sync_to_async(stack.start_worker)("tmux")
        session, cookie = await sync_to_async(terminal)(operator, "tmux")
        viewer = await Viewer.open(stack.ports[0], session.id, cookie)
        attached = await viewer.attach()
        await viewer.type("echo pid-$$-shell\r")
        shell_pid = (await viewer.read_match(rb"pid-(\d+)-shell\r\n")).group(1)

        first.kill()
        await sync_to_async(first.wait)()
        await sync_to_async(stack.start_worker)("tmux")

        again = await viewer.wait_for("attached", timeout=40)
        assert again["epoch"] > attached["epoch"] and again["fresh"] is True
        assert again["generation"] == attached["generation"]  # the same shell, not a fresh one
        await viewer.type("echo pid-$$-again\r")
        assert (await viewer.read_match(rb"pid-(\d+)-again\r\n", timeout=20)).group(1) == shell_pid
        await viewer.close()
    finally:
        await sync_to_async(stack.stop)()


def test_a_worker_on_the_same_host_adopts_a_killed_siblings_shell_when_its_lease_expires(terminal, operator):
    """The periodic recovery pass is set to ten minutes here: the surviving worker sees its sibling die
    (through a pidfd) and adopts the tmux shell as soon as the dead one's lease expires."""
    stack = Stack()
    stack.extra_env["TETHER_RECOVERY_SECONDS"] = "600"
    try:
        first = stack.start_worker("tmux")
        session, _ = terminal(operator, "tmux")
        held = wait_for(
            lambda: ProcessLease.objects.filter(
                execution_id=session.execution_id, released_at__isnull=True, handle__has_key="pane"
            ).first(),
            what="the first worker to hold the shell",
        )
        second = stack.start_worker("tmux")
        time.sleep(1.5)  # the survivor lists its siblings on its first beat
        first.send_signal(signal.SIGKILL)
        first.wait()
        ttl = int(stack.env()["TETHER_LEASE_TTL_SECONDS"])
        adopted = wait_for(
            lambda: ExecutionEvent.objects.filter(execution_id=session.execution_id, evidence=Evidence.ADOPTED).first(),
            timeout=ttl + 8,
            what="adoption well before the ten-minute pass",
        )
        lease = ProcessLease.objects.get(execution_id=session.execution_id, released_at__isnull=True)
        assert lease.token > held.token and lease.worker.pid == second.pid
        assert adopted.execution.state == State.RUNNING
    finally:
        stack.stop()


async def test_an_adopted_tmux_shell_is_redrawn_for_the_grid_of_the_viewer_that_comes_back(terminal, operator):
    """The screen as adopted is the old grid's (149x44): a viewer attaching at 43x20 gets the screen as it is
    at 43x20, not 44 rows of 149 columns torn across its own."""
    from asgiref.sync import sync_to_async

    from terminals.admin import screen_text
    from tests.bridge.harness import Viewer

    stack = crash_stack()
    try:
        await sync_to_async(stack.start_daphne)()
        first = await sync_to_async(stack.start_worker)("tmux")
        session, cookie = await sync_to_async(terminal)(operator, "tmux")
        wide = await Viewer.open(stack.ports[0], session.id, cookie)
        attached = await wide.attach(cols=149, rows=44)
        await wide.type("printf 'row-%s\\n' $(seq 1 60); printf '%0140d\\n' 7; echo end-$((2*21))\r")
        await wide.read_until(b"end-42\r\n")
        await wide.close()
        first.kill()
        await sync_to_async(first.wait)()
        await sync_to_async(stack.start_worker)("tmux")
        await asyncio.sleep(int(stack.env()["TETHER_LEASE_TTL_SECONDS"]) + 2)  # adopted meanwhile

        narrow = await Viewer.open(stack.ports[0], session.id, cookie)
        again = await narrow.attach(
            since=attached["end"], cols=43, rows=20, generation=attached["generation"], epoch=attached["epoch"]
        )
        assert again["fresh"] is True and again["screen"], again
        # Wrapped lines come joined (drawn, they wrap at the viewer's width as tmux wrapped them).
        lines = screen_text(base64.b64decode(again["screen"])).strip("\n").split("\n")
        assert sum(max(1, -(-len(line) // 43)) for line in lines) <= 20, lines
        assert "end-42" in lines and "0" * 100 in "".join(lines)
        await narrow.type("echo still-$((6*7))\r")
        await narrow.read_until(b"still-42")
        await narrow.close()
    finally:
        await sync_to_async(stack.stop)()
