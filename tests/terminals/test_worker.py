"""The owner worker as a loop over one step, its leases, and what it leaves behind when it stops."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connections
from django.utils import timezone

from executions import actions as exec_actions
from executions.errors import Refused, SlotTaken
from executions.models import Evidence, Execution, ExecutionEvent, State
from terminals import actions
from terminals.backends.procfs import ProcessIdentity, boot_id
from terminals.models import ProcessLease, ProcessState, TerminalSession, Worker, WorkerState
from terminals.outcome import Outcome
from terminals.protocol import Reason
from terminals.worker import OwnerWorker
from tests.bridge.harness import Stack
from tests.factories import TEST_ACTOR, grant, make_machine, make_spec

pytestmark = pytest.mark.django_db(transaction=True)
ROOT = Path(__file__).resolve().parents[2]


async def _until(predicate, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = await sync_to_async(predicate)()
        if value:
            return value
        await asyncio.sleep(0.05)
    raise AssertionError("condition not met in time")


async def test_one_step_claims_runs_and_records_a_command():
    machine = await sync_to_async(make_machine)("step-box")

    def submit(execution_id: str, *argv: str):
        return exec_actions.submit_execution(
            scope="team-a",
            execution_id=execution_id,
            machine_name=machine.name,
            spec=make_spec(*argv),
            actor=TEST_ACTOR,
        )[0]

    worker = OwnerWorker(backends={"local"})
    await worker.start()
    # Registered as the process it is: recovery tells a dead owner from a live one by these.
    me = ProcessIdentity.of(os.getpid())
    registered = await sync_to_async(Worker.objects.get)(pk=worker.worker.pk)
    assert (registered.host, registered.pid, registered.process_started_at, registered.boot_id) == (
        socket.gethostname(),
        me.pid,
        me.start_time,
        boot_id(),
    )
    assert registered.heartbeat_at is not None and registered.state == WorkerState.RUNNING
    assert await worker.handle_one_step() is False  # nothing pending: an idle step
    execution = await sync_to_async(submit)("job-1", "sh", "-c", "printf 'out put'; exit 3")
    assert await worker.handle_one_step() is True
    done = await _until(lambda: Execution.objects.filter(pk=execution.pk, state=State.COMPLETED).first())
    assert (done.evidence, done.exit_code, bytes(done.output)) == (Evidence.EXITED, 3, b"out put")
    events = await sync_to_async(lambda: list(done.events.values_list("to_state", "actor")))()
    assert [to for to, _ in events] == ["pending", "dispatched", "running", "completed"]
    assert all(actor == f"worker:{worker.worker.worker_id}" for _, actor in events[1:])
    lease = await sync_to_async(ProcessLease.objects.get)(execution=done)
    assert lease.released_at is not None and lease.token == 1
    await worker.shutdown()


async def test_a_program_that_cannot_start_is_recorded_plainly():
    machine = await sync_to_async(make_machine)("nowhere-box")
    execution = await sync_to_async(
        lambda: exec_actions.submit_execution(
            scope="team-a",
            execution_id="bad",
            machine_name=machine.name,
            spec=make_spec("no-such-program-q"),
            actor=TEST_ACTOR,
        )[0]
    )()
    worker = OwnerWorker(backends={"local"})
    await worker.start()
    await worker.handle_one_step()
    done = await sync_to_async(Execution.objects.get)(pk=execution.pk)
    assert (done.state, done.evidence) == (State.COMPLETED, Evidence.SPAWN_FAILED)
    assert done.outcome_label == "Did not start"
    await worker.shutdown()


def test_a_live_terminal_holds_the_slot_and_opening_again_reattaches(operator):
    machine = make_machine("term-box")
    session, created = actions.open_terminal(machine, operator)
    again, created_again = actions.open_terminal(machine, operator)
    assert created and not created_again and again.pk == session.pk
    with pytest.raises(SlotTaken, match=f"held by team-a/terminal-{session.id}-1"):
        exec_actions.submit_execution(
            scope="team-a", execution_id="cmd", machine_name=machine.name, spec=make_spec(), actor=TEST_ACTOR
        )


def test_host_shells_are_for_staff_and_the_session_cap_holds(alice, operator, settings):
    host = make_machine("host-1")
    grant(alice, host)  # a grant is not enough for a host shell: staff only (TETHER_HOST_SHELLS_FOR_ALL is off)
    with pytest.raises(Refused, match="may not open a shell"):
        actions.open_terminal(host, alice)
    settings.TETHER_SESSIONS_PER_USER = 2
    actions.open_terminal(make_machine("cap-1"), operator)
    actions.open_terminal(make_machine("cap-2"), operator)
    with pytest.raises(Refused, match="reattach to one of them"):
        actions.open_terminal(make_machine("cap-3"), operator)


def test_a_stale_worker_cannot_write_after_losing_its_lease(operator):
    machine = make_machine("fence-box")
    session, _ = actions.open_terminal(machine, operator)
    me = Worker.objects.create(
        worker_id="w1",
        host=settings.TETHER_HOST,
        pid=1,
        process_started_at=1,
        boot_id="b",
        heartbeat_at="2026-01-01T00:00Z",
    )
    execution, lease = actions.claim_next_execution(me, {"local"})
    assert actions.note_viewer(session.pk, me, lease.token, "window-1")
    ProcessLease.objects.filter(pk=lease.pk).update(token=lease.token + 1)  # someone else claimed it
    with pytest.raises(actions.LeaseLost):
        actions.fenced_transition(execution, State.RUNNING, worker=me, token=lease.token, evidence=Evidence.OBSERVED)
    assert Execution.objects.get(pk=execution.pk).state == State.DISPATCHED
    # Nor may it say which window views the session.
    assert not actions.note_viewer(session.pk, me, lease.token, "window-2")
    assert TerminalSession.objects.get(pk=session.pk).viewer_id == "window-1"
    # Nor keep the lease with its heartbeat: the lease is uncovered and lasts only to its own expiry.
    expires = ProcessLease.objects.get(pk=lease.pk).expires_at
    _state, held = actions.worker_heartbeat(me, {execution.pk: lease.token})
    assert held[execution.pk][0] == lease.token + 1
    after = ProcessLease.objects.get(pk=lease.pk)
    assert (after.expires_at, after.covered) == (expires, False)


def test_registration_and_leases_use_the_database_clock(monkeypatch):
    """A worker whose own clock is an hour off still registers, beats and leases on PostgreSQL's time."""
    from django.db import connection

    machine = make_machine("clock-box")
    exec_actions.submit_execution(
        scope="team-a", execution_id="clocked", machine_name=machine.name, spec=make_spec(), actor=TEST_ACTOR
    )
    skewed = timezone.now() + timedelta(hours=1)
    monkeypatch.setattr(timezone, "now", lambda: skewed)
    me = ProcessIdentity.of(os.getpid())
    worker = actions.register_worker(
        worker_id="w-clock",
        host=socket.gethostname(),
        pid=me.pid,
        started_at=me.start_time,
        boot_id=boot_id(),
        channel_name="tether.worker.w-clock",
    )
    _execution, lease = actions.claim_next_execution(worker, {"local"})
    actions.worker_heartbeat(worker, {lease.execution_id: lease.token})
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        (db_now,) = cursor.fetchone()
    worker.refresh_from_db()
    lease.refresh_from_db()
    assert (worker.host, worker.pid, worker.process_started_at, worker.boot_id) == (
        socket.gethostname(),
        os.getpid(),
        me.start_time,
        boot_id(),
    )
    assert abs((worker.heartbeat_at - db_now).total_seconds()) < 5
    for until in (lease.expires_at, worker.lease_until):  # the lease's own expiry, and its worker's beat's
        ttl = (until - db_now).total_seconds()
        assert settings.TETHER_LEASE_TTL_SECONDS - 5 < ttl <= settings.TETHER_LEASE_TTL_SECONDS


def test_two_workers_racing_for_one_execution_launch_it_once():
    machine = make_machine("race-box")
    exec_actions.submit_execution(
        scope="team-a", execution_id="once", machine_name=machine.name, spec=make_spec(), actor=TEST_ACTOR
    )
    workers = [
        actions.register_worker(
            worker_id=f"w-race-{n}", host=settings.TETHER_HOST, pid=n, started_at=n, boot_id="b", channel_name=f"c{n}"
        )
        for n in range(8)
    ]
    barrier = threading.Barrier(len(workers))
    claims = []

    def claim(worker):
        barrier.wait()
        try:
            claims.append(actions.claim_next_execution(worker, {"local"}))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=claim, args=(worker,)) for worker in workers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    taken = [claim for claim in claims if claim is not None]
    assert len(taken) == 1 and len(claims) == len(workers)
    assert ProcessLease.objects.get().worker_id == taken[0][1].worker_id
    assert list(Execution.objects.get().events.values_list("to_state", flat=True)) == ["pending", "dispatched"]


def _wait_until_running(execution_pk: int, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while Execution.objects.get(pk=execution_pk).state != State.RUNNING:
        assert time.monotonic() < deadline, "the process never started"
        time.sleep(0.05)


def _once_no_longer_running(execution_pk: int, timeout: float, what: str) -> Execution:
    deadline = time.monotonic() + timeout
    while (execution := Execution.objects.get(pk=execution_pk)).state == State.RUNNING:
        assert time.monotonic() < deadline, what
        time.sleep(0.1)
    return execution


def test_sigterm_stops_the_worker_and_records_what_it_ended(operator):
    """Without the session holder (TETHER_HOLDER=0) the worker holds a local shell's PTY itself."""
    machine = make_machine("stop-box")
    session, _ = actions.open_terminal(machine, operator)
    stack = Stack()
    stack.extra_env["TETHER_HOLDER"] = "0"
    try:
        worker = stack.start_worker("local")
        _wait_until_running(session.execution_id)
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=20) == 0
    finally:
        stack.stop()
    execution = Execution.objects.get(pk=session.execution_id)
    # A local PTY cannot outlive its owner: it was ended, proven gone, and recorded as killed, never "failed".
    assert (execution.state, execution.evidence, execution.close_reason) == (
        State.COMPLETED,
        Evidence.KILLED,
        "server_restart",
    )
    session = TerminalSession.objects.get(pk=session.pk)
    assert (session.process_state, session.close_reason) == (ProcessState.CLOSED, "server_restart")
    assert Worker.objects.get().state == WorkerState.STOPPED


def test_sigterm_leaves_a_held_shell_running_and_the_next_worker_adopts_the_same_shell(operator):
    """A routine restart kills no shell: the session holder keeps it, and the next worker takes it over."""
    machine = make_machine("held-box")
    session, _ = actions.open_terminal(machine, operator)
    stack = Stack()
    stack.extra_env["TETHER_RECOVERY_SECONDS"] = "1"
    try:
        worker = stack.start_worker("local")
        _wait_until_running(session.execution_id)
        lease = ProcessLease.objects.get(execution_id=session.execution_id)
        assert lease.handle.holder is not None
        shell = lease.handle.process
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=20) == 0
        assert shell.is_alive()
        assert Execution.objects.get(pk=session.execution_id).state == State.RUNNING
        assert TerminalSession.objects.get(pk=session.pk).process_state != ProcessState.CLOSED
        stack.start_worker("local")
        deadline = time.monotonic() + 30
        while not ExecutionEvent.objects.filter(execution_id=session.execution_id, evidence=Evidence.ADOPTED).exists():
            assert time.monotonic() < deadline, "the next worker never adopted the held shell"
            time.sleep(0.2)
        adopted = ProcessLease.objects.get(execution_id=session.execution_id, released_at__isnull=True)
        assert adopted.worker_id != lease.worker_id and adopted.handle.process == lease.handle.process
        assert shell.is_alive()
    finally:
        stack.stop()


async def test_command_output_keeps_its_last_bytes_and_counts_what_it_dropped(settings):
    settings.TETHER_COMMAND_OUTPUT_BYTES = 1000
    machine = await sync_to_async(make_machine)("chatty-box")
    # 5,000 numbered bytes, then an end marker: the record keeps the last 1,000 and says 4,000+ went.
    program = "i=0; while [ $i -lt 500 ]; do printf '%09d\\n' $i; i=$((i+1)); done; printf END"
    execution = await sync_to_async(
        lambda: exec_actions.submit_execution(
            scope="team-a",
            execution_id="chatty",
            machine_name=machine.name,
            spec=make_spec("sh", "-c", program),
            actor=TEST_ACTOR,
        )[0]
    )()
    worker = OwnerWorker(backends={"local"})
    await worker.start()
    await worker.handle_one_step()
    done = await _until(lambda: Execution.objects.filter(pk=execution.pk, state=State.COMPLETED).first())
    output = bytes(done.output)
    assert len(output) == 1000 and output.endswith(b"000000499\r\nEND")
    # The PTY turns each \n into \r\n: 500 lines of 11 bytes and END were produced.
    assert done.output_truncated == 500 * 11 + 3 - 1000
    assert done.close_reason == "exited"  # a command has no session: its record says why it closed
    await worker.shutdown()


def _manage(stack: Stack, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=stack.env(),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_submitted_command_runs_and_exec_await_waits_for_its_outcome():
    make_machine("cli-box")
    stack = Stack()
    try:
        stack.start_worker("local")
        submit = ["exec_submit", "--scope", "team-a", "--id", "cli-1", "--machine", "cli-box", "--json", "--"]
        submitted = _manage(stack, *submit, "sh", "-c", "sleep 5; echo done here; exit 7")
        assert submitted.returncode == 0, submitted.stderr
        # Not settled within half a second: exit 6, one line saying so, and the record as it stands.
        early = _manage(stack, "exec_await", "team-a", "cli-1", "--timeout", "0.5", "--json")
        assert early.returncode == 6, early.stderr
        assert json.loads(early.stdout)["state"] in ("pending", "dispatched", "running")
        assert "timed out" in early.stderr and early.stderr.count("\n") == 1
        done = _manage(stack, "exec_await", "team-a", "cli-1", "--timeout", "30", "--json")
        assert done.returncode == 0, done.stderr
        data = json.loads(done.stdout)
        assert (data["state"], data["evidence"], data["exit_code"]) == ("completed", "exited", 7)
        assert data["output"] == "done here\r\n"
        text = _manage(stack, "exec_await", "team-a", "cli-1")
        assert "exit_code: 7" in text.stdout and "done here" in text.stdout
        # Submitting it again returns the record and runs nothing.
        events = ExecutionEvent.objects.filter(execution__execution_id="cli-1").count()
        again = _manage(stack, *submit, "sh", "-c", "sleep 5; echo done here; exit 7")
        assert again.returncode == 0 and json.loads(again.stdout)["exit_code"] == 7
        time.sleep(1)
        assert ExecutionEvent.objects.filter(execution__execution_id="cli-1").count() == events
        missing = _manage(stack, "exec_await", "team-a", "no-such-id", "--timeout", "1")
        assert missing.returncode == 5 and missing.stderr.count("\n") == 1
        # On pipes: each stream said apart.
        piped = ["exec_submit", "--scope", "team-a", "--id", "cli-2", "--machine", "cli-box", "--pipes", "--"]
        assert _manage(stack, *piped, "sh", "-c", "echo out; echo err >&2").returncode == 0
        text = _manage(stack, "exec_await", "team-a", "cli-2", "--timeout", "30").stdout
        assert "  stdout (4 bytes):\nout\n" in text and "  stderr (4 bytes):\nerr" in text, text
    finally:
        stack.stop()


@pytest.mark.parametrize("variant", ["docker", "docker-plain", "tmux", "local"])
def test_sigterm_leaves_a_command_running_for_the_next_worker(place, variant):
    """Held (docker, local) and tmux commands are adopted by the next worker; a plain docker exec (no
    holder) is watched until docker reports its exit."""
    backend = variant.removesuffix("-plain")
    machine = place(backend)
    execution, _ = exec_actions.submit_execution(
        scope="team-a",
        execution_id="deploy-1",
        machine_name=machine.name,
        # Long enough that the next worker (two or three seconds to start) finds it still running.
        spec=make_spec("sh", "-c", "sleep 7; exit 4"),
        actor=TEST_ACTOR,
    )
    stack = Stack()
    if variant == "docker-plain":
        stack.extra_env["TETHER_HOLDER"] = "0"
    try:
        first = stack.start_worker(backend)
        _wait_until_running(execution.pk)
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=20) == 0
        # The worker stopped without ending it or writing an outcome it did not see.
        assert Execution.objects.get(pk=execution.pk).state == State.RUNNING
        assert ProcessLease.objects.get(execution=execution).released_at is None
        stack.start_worker(backend)
        done = _once_no_longer_running(execution.pk, 20, "the next worker never recorded the exit")
    finally:
        stack.stop()
    # Its own exit code: it ran to the end under the next worker's watch; it was not killed.
    assert (done.state, done.evidence, done.exit_code) == (State.COMPLETED, Evidence.EXITED, 4)
    if variant == "docker-plain":  # watched, then read back from docker
        assert "docker exec inspect" in done.events.order_by("-at").first().reason
    else:  # adopted, then seen exiting by its new owner
        assert done.events.filter(evidence=Evidence.ADOPTED).exists()


def test_a_reset_hands_the_slot_straight_to_the_fresh_shell(operator):
    machine = make_machine("reset-box")
    session, _ = actions.open_terminal(machine, operator)
    worker = actions.register_worker(
        worker_id="w-reset",
        host=settings.TETHER_HOST,
        pid=1,
        started_at=1,
        boot_id="b",
        channel_name="tether.worker.w-reset",
    )
    execution, lease = actions.claim_next_execution(worker, {"local"})
    execution = actions.fenced_transition(
        execution, State.RUNNING, worker=worker, token=lease.token, evidence=Evidence.OBSERVED
    )
    reset = Outcome(State.COMPLETED, Evidence.RESET, "", Reason.RESET, {"exit_signal": signal.SIGHUP})
    actions.settle_execution(execution, reset, worker=worker, token=lease.token, restart_session=True)
    session.refresh_from_db()
    machine.refresh_from_db()
    execution.refresh_from_db()
    assert (execution.state, execution.close_reason) == (State.COMPLETED, "reset")
    # The old shell's record is settled and the fresh one already holds the slot: no moment in between
    # when a command could slip in and leave the reset with nowhere to start.
    assert session.generation == 2 and session.process_state == ProcessState.LIVE
    assert machine.active_execution_id == session.execution_id != execution.pk
    with pytest.raises(SlotTaken) as refused:
        exec_actions.submit_execution(
            scope="team-a", execution_id="sneak", machine_name=machine.name, spec=make_spec("true"), actor=TEST_ACTOR
        )
    assert session.execution.execution_id in str(refused.value)


def test_a_command_whose_exit_can_no_longer_be_read_is_recorded_unknown(place):
    """The tmux pane's shim records the program's exit; killed first, nobody can say how the program ended."""
    machine = place("tmux")
    execution, _ = exec_actions.submit_execution(
        scope="team-a",
        execution_id="unseen",
        machine_name=machine.name,
        spec=make_spec("sleep", "20"),
        actor=TEST_ACTOR,
    )
    stack = Stack()
    try:
        stack.start_worker("tmux")
        _wait_until_running(execution.pk)
        panes = subprocess.run(
            ["tmux", "-L", machine.ref, "list-panes", "-a", "-F", "#{pane_pid}"], capture_output=True, text=True
        )
        os.kill(int(panes.stdout.split()[0]), signal.SIGKILL)  # the shim, the pane's own process
        done = _once_no_longer_running(execution.pk, 30, "the worker never noticed the pane had died")
    finally:
        stack.stop()
    # The stream ended with no exit anyone saw: unknown, never failed, and the slot stays held.
    assert (done.state, done.evidence, done.exit_code) == (State.UNKNOWN, Evidence.CONTROLLER_LOST, None)
    machine.refresh_from_db()
    assert machine.active_execution_id == execution.pk
