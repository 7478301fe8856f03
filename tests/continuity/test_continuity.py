"""Interruptions that must not hurt: reconnects, stalled browsers, idle and deadline closes, cancels."""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import subprocess
import sys
import time

import pytest
from asgiref.sync import sync_to_async

from executions import actions as exec_actions
from executions.models import Evidence, Execution, State
from terminals import actions as terminal_actions
from terminals.models import ProcessState, TerminalSession
from terminals.protocol import CloseCode
from tests.bridge.harness import ROOT, Stack, Viewer, database_url, open_viewer, session_cookie, without_marks
from tests.factories import TEST_ACTOR, make_spec

pytestmark = [pytest.mark.continuity, pytest.mark.django_db(transaction=True)]


async def _open(stack, terminal, user, backend: str = "local") -> tuple[Viewer, object, str]:
    viewer, session, cookie = await open_viewer(stack, terminal, user, backend)
    # A fixed prompt makes "the shell is back" easy to see.
    await viewer.type("PS1='ready> '\r")
    await viewer.read_until(b"ready> ")
    return viewer, session, cookie


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))


async def test_disconnect_during_20_mb_then_reconnect_receives_every_byte_once(stack, terminal, operator, tmp_path):
    data = tmp_path / "payload.b64"
    with open(data, "wb") as handle:
        subprocess.run(["base64", "-w", "76"], input=os.urandom(15_000_000), stdout=handle, check=True)
    produced = hashlib.sha256(data.read_bytes()).hexdigest()
    viewer, session, cookie = await _open(stack, terminal, operator)
    # Markers with '!', which base64 never contains.
    await viewer.type(f"printf '!BEGIN!\\n'; cat {data}; printf '!END!\\n'\r")
    await viewer.read_until(b"!BEGIN!\r\n")
    while len(viewer.output) < 3_000_000:
        await viewer._next(10)
    received, offset, generation = bytes(viewer.output), viewer.offset, viewer.messages[-1].get("generation")
    await viewer.close()  # the laptop lid closes mid-stream
    await asyncio.sleep(1.0)
    again = await Viewer.open(stack.ports[0], session.id, cookie)
    attached = await again.attach(since=offset, generation=1)
    assert (attached["offset"], attached["lost"]) == (offset, 0)
    await again.read_until(b"!END!\r\n", timeout=120)
    stream = received + bytes(again.output)
    body = stream[stream.index(b"!BEGIN!\r\n") + 9 : stream.index(b"!END!\r\n")]
    assert hashlib.sha256(body.replace(b"\r\n", b"\n")).hexdigest() == produced
    assert generation is None or generation == 1


async def test_reconnect_after_the_buffer_rolled_over_gets_a_gap_with_the_right_count(terminal, operator, settings):
    stack = Stack(extra_env={"TETHER_RECONNECT_GRACE_SECONDS": "0", "TETHER_BUFFER_BYTES": "131072"})
    try:
        await sync_to_async(stack.start)("local")
        viewer, session, cookie = await _open(stack, terminal, operator)
        command = "head -c 3000000 /dev/zero | tr '\\0' x; printf '\\nDONE\\n'\r"
        # At the prompt: typed ahead of it, the line is echoed twice (by the terminal, then by readline).
        # The "ready> " prompt's mark: the second of the output (the first prompt had one), and maybe already
        # read with the echo of the PS1 line (a wait for the next mark from here would then never end).
        while viewer.output.count(b"\x1b]133;A;") < 2:
            await viewer._next(10)
        await viewer.type(command)
        while viewer.output.count(b"x") < 100_000:
            await viewer._next(10)
        # Less the echoed line, and the shell's command mark, which names the line too (docs/commands.md).
        offset, before = viewer.offset, without_marks(viewer.output).count(b"x") - command.count("x")
        await viewer.close()
        await asyncio.sleep(3)  # long enough for the rest of the 3 MB to roll through the 128 KiB buffer
        again = await Viewer.open(stack.ports[0], session.id, cookie)
        attached = await again.attach(since=offset, generation=1)
        assert attached["lost"] > 0 and attached["offset"] == offset + attached["lost"]
        await again.read_until(b"DONE\r\n")
        after = bytes(again.output).count(b"x")
        # Everything lost lay inside the run of x's: seen before + lost + seen after is all of them.
        assert before + attached["lost"] + after == 3_000_000
    finally:
        await sync_to_async(stack.stop)()


async def test_input_before_attaching_never_reaches_the_shell(stack, terminal, operator):
    session, cookie = await sync_to_async(terminal)(operator)
    viewer = await Viewer.open(stack.ports[0], session.id, cookie)
    await viewer.type("echo typed-while-away-$((40+2))\r")
    error = await viewer.wait_for("error")
    assert "dropped" in error["message"]
    await viewer.attach()
    await viewer.type("echo now-$((1+1))\r")
    output = await viewer.read_until(b"now-2\r\n")
    await asyncio.sleep(0.5)
    # Not in the output as it shows (the invisible marks carry a random nonce and the time, digits and all).
    assert b"typed-while-away" not in output and b"42" not in without_marks(viewer.output)


async def test_stalled_client_under_yes_costs_bounded_memory_and_ctrl_c_gets_through(stack, terminal, operator):
    viewer, _, _ = await _open(stack, terminal, operator)
    worker_pid = stack.workers[0].pid
    viewer.auto_ack = False  # the browser stalls: it renders and acknowledges nothing more

    await viewer.type("yes\r")
    await viewer.read_for(3)
    baseline = _rss_kib(worker_pid)
    peak = baseline
    # 12 s of stall in all: flow control failing would show within a second (yes writes tens of MB/s here);
    # make bench holds one for 60 s.
    for _ in range(9):
        await viewer.read_for(1)
        peak = max(peak, _rss_kib(worker_pid))
    assert peak - baseline < 10 * 1024, f"worker RSS grew by {peak - baseline} KiB under a stalled client"
    await viewer.type(b"\x03")
    viewer.auto_ack = True
    await viewer.ack()
    started = time.monotonic()
    await viewer.read_until(b"ready> ", timeout=30)
    assert time.monotonic() - started < 30


async def test_idle_session_is_warned_then_reaped(stack, terminal, operator, settings):
    settings.TETHER_IDLE_SECONDS = 4
    viewer, session, _ = await _open(stack, terminal, operator)
    warning = await viewer.wait_for("warning", timeout=10)
    assert warning["reason"] == "idle" and warning["seconds_left"] >= 1
    exit = await viewer.wait_for("exit", timeout=10)
    assert exit["reason"] == "idle" and exit["evidence"] == Evidence.IDLE_REAPED
    assert await viewer.wait_closed() == CloseCode.IDLE
    closed = await sync_to_async(TerminalSession.objects.get)(pk=session.pk)
    assert (closed.process_state, closed.close_reason, closed.snapshot_kind) == (
        ProcessState.CLOSED,
        "idle",
        "archived",
    )


async def test_keep_alive_keeps_an_idle_session(stack, terminal, operator, settings):
    settings.TETHER_IDLE_SECONDS = 5
    viewer, _, _ = await _open(stack, terminal, operator)
    await viewer.wait_for("warning", timeout=10)
    await viewer.send_json({"type": "keepalive"})
    await asyncio.sleep(2.5)  # past the original idle limit
    await viewer.type("echo still-here\r")
    await viewer.read_until(b"still-here\r\n")
    assert not any(m["type"] == "exit" for m in viewer.messages)


async def test_session_deadline_closes_with_its_own_reason(stack, terminal, operator, settings):
    settings.TETHER_SESSION_SECONDS = 3
    viewer, _, _ = await _open(stack, terminal, operator)
    exit = await viewer.wait_for("exit", timeout=10)
    assert (exit["reason"], exit["evidence"], exit["outcome"]) == (
        "deadline",
        "deadline",
        "Closed: session deadline reached",
    )
    assert await viewer.wait_closed() == CloseCode.DEADLINE


async def test_dead_process_at_attach_reports_its_exit_then_starts_fresh(stack, terminal, operator):
    viewer, session, cookie = await _open(stack, terminal, operator)
    await viewer.type('echo "pid:$$:"\r')
    first_pid = (await viewer.read_match(rb"pid:(\d+):")).group(1)
    await viewer.type("exit 7\r")
    exit = await viewer.wait_for("exit")
    assert exit["outcome"] == "Exited with code 7"
    assert await viewer.wait_closed() == CloseCode.EXITED
    again = await Viewer.open(stack.ports[0], session.id, cookie)
    await again.send_json({"type": "attach", "since": 0, "cols": 80, "rows": 24})
    reported = await again.wait_for("exit")
    assert reported["outcome"] == "Exited with code 7" and reported["generation"] == 1
    await again.wait_for("reset")
    attached = await again.wait_for("attached")
    assert attached["generation"] == 2
    await again.type('echo "pid:$$:"\r')
    assert (await again.read_match(rb"pid:(\d+):")).group(1) != first_pid


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DATABASE_URL": database_url()}
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )


def test_cancel_before_dispatch_frees_the_slot_and_nothing_runs(place, tmp_path):
    marker = tmp_path / "ran"
    machine = place("local", "idle-box")  # no worker is running: the execution stays pending
    exec_actions.submit_execution(
        scope="team-a",
        execution_id="never",
        machine_name=machine.name,
        spec=make_spec("touch", str(marker)),
        actor=TEST_ACTOR,
    )
    result = _cli("exec_cancel", "team-a", "never", "--json")
    assert result.returncode == 0, result.stderr
    assert '"state": "cancelled"' in result.stdout
    machine.refresh_from_db()
    assert machine.active_execution is None
    assert not marker.exists()


def test_cancel_after_dispatch_ends_the_tree_and_records_killed(stack, place, tmp_path):
    machine = place("local", "busy-box")
    beat = tmp_path / "beat"
    spec = make_spec("sh", "-c", f"setsid sh -c 'while :; do date +%s%N > {beat}; sleep 0.1; done' & sleep 1000")
    execution, _ = exec_actions.submit_execution(
        scope="team-a", execution_id="long", machine_name=machine.name, spec=spec, actor=TEST_ACTOR
    )
    deadline = time.monotonic() + 15
    while Execution.objects.get(pk=execution.pk).state != State.RUNNING or not beat.exists():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    result = _cli("exec_cancel", "team-a", "long", "--json")
    assert result.returncode == 0, result.stderr
    execution.refresh_from_db()
    assert (execution.state, execution.evidence) == (State.COMPLETED, Evidence.KILLED)
    settled = beat.read_text()
    time.sleep(0.5)
    assert beat.read_text() == settled, "the detached grandchild survived the cancel"
    assert re.search(r"cancel requested", " ".join(execution.events.values_list("reason", flat=True)))


async def test_output_budget_closes_with_its_own_reason(stack, terminal, operator, settings):
    settings.TETHER_OUTPUT_LIMIT_BYTES = 200_000
    viewer, session, _ = await _open(stack, terminal, operator)
    await viewer.type("yes budget\r")  # endless: only the budget stops it
    exit = await viewer.wait_for("exit", timeout=20)
    assert (exit["reason"], exit["evidence"], exit["outcome"]) == (
        "output_limit",
        "output_limit",
        "Closed: output limit reached",
    )
    assert await viewer.wait_closed() == CloseCode.OUTPUT_LIMIT
    assert len(viewer.output) > 200_000  # it ran until it passed the budget (checked every second)
    closed = await sync_to_async(TerminalSession.objects.get)(pk=session.pk)
    assert (closed.process_state, closed.close_reason) == (ProcessState.CLOSED, "output_limit")


async def test_tmux_reconnect_past_the_buffer_gets_the_screen_as_it_is_now(terminal, operator):
    """Bytes gone from the buffer: tmux still knows the screen, so the viewer gets it, labelled with the count."""
    import base64

    stack = Stack(extra_env={"TETHER_RECONNECT_GRACE_SECONDS": "0", "TETHER_BUFFER_BYTES": "131072"})
    try:
        await sync_to_async(stack.start)("tmux")
        viewer, session, cookie = await _open(stack, terminal, operator, "tmux")
        offset = viewer.offset
        await viewer.close()
        await asyncio.sleep(0.5)
        await sync_to_async(_type_while_away)(session, "seq 1 60000; echo screen-$((3*3))\r")
        await asyncio.sleep(6)  # ~400 KB through a 128 KiB buffer, viewer away
        again = await Viewer.open(stack.ports[0], session.id, cookie)
        epoch = next(m for m in viewer.messages if m["type"] == "attached")["epoch"]
        attached = await again.attach(since=offset, generation=1, epoch=epoch)
        assert attached["lost"] > 131072
        screen = base64.b64decode(attached["screen"])
        assert b"screen-9" in screen and b"60000" in screen  # the end of the output, as tmux shows it
        assert attached["offset"] == attached["end"]  # nothing replayed: the screen stands for it
        await again.type("echo after-$((5*5))\r")
        await again.read_until(b"after-25")
    finally:
        await sync_to_async(stack.stop)()


def _type_while_away(session, text: str) -> None:
    """Type into the shell with no viewer attached, as a staff command would (tmux send-keys on its socket)."""
    import subprocess

    from terminals.models import ProcessLease

    handle = ProcessLease.objects.get(execution_id=session.execution_id).handle
    subprocess.run(["tmux", "-L", handle.socket, "send-keys", "-t", handle.pane, "-l", text], check=True)


async def test_streaming_sessions_share_the_workers_flow_budget(place, operator):
    """Four sessions start `yes` together and their viewers acknowledge nothing: together they are sent no
    more than the worker's budget (plus one read each), not four whole windows, and each gets a share."""
    budget = 256 * 1024
    stack = Stack()
    stack.extra_env["TETHER_FLOW_WORKER_BYTES"] = str(budget)
    try:
        await sync_to_async(stack.start)("local")

        def opened(n: int):
            return terminal_actions.open_terminal(place("local", f"flow-{n}"), operator)[0]

        sessions = [await sync_to_async(opened)(n) for n in range(4)]
        cookie = await sync_to_async(session_cookie)(operator)
        viewers = [await Viewer.open(stack.ports[0], session.id, cookie) for session in sessions]
        for viewer in viewers:
            await viewer.attach()
            viewer.auto_ack = False
            await viewer.type("sleep 1; yes\r")
        await asyncio.gather(*(viewer.read_for(4) for viewer in viewers))
        sent = [viewer.offset - viewer.acked for viewer in viewers]
        assert sum(sent) <= budget + 4 * 64 * 1024, sent
        assert all(size > 0 for size in sent), sent
    finally:
        await sync_to_async(stack.stop)()
