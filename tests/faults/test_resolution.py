"""The resolution procedure checks for itself: each failed check refuses and is named; racing operators get one
winner; drain_worker makes a live owner let go so its execution can be resolved."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from django.db import connection
from django.db.models.functions import Now

from executions import actions as exec_actions
from executions.models import Evidence, Execution, ExecutionEvent, Machine, State
from terminals import actions
from terminals.backends.procfs import ProcessIdentity, boot_id
from terminals.models import ProcessLease, Worker, WorkerEvent, WorkerState
from terminals.resolution import ResolveRefused, resolve
from tests.bridge.harness import Stack, wait_for
from tests.factories import TEST_ACTOR, make_spec

pytestmark = [pytest.mark.faults, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]


def register(pid: int, start_time: int, host: str | None = None) -> Worker:
    import socket
    import uuid

    return actions.register_worker(
        worker_id=uuid.uuid4().hex,
        host=host or socket.gethostname(),
        pid=pid,
        started_at=start_time,
        boot_id=boot_id(),
        channel_name="",
    )


def unknown_execution(place, backend: str, handle: dict, worker: Worker, name: str):
    """An execution a worker claimed and then lost, as recovery leaves it."""
    machine = place(backend, name)
    execution, _ = exec_actions.submit_execution(
        scope="team-a", execution_id=name, machine_name=machine.name, spec=make_spec("sleep", "1000"), actor=TEST_ACTOR
    )
    execution, lease = actions.claim_next_execution(worker, {backend})
    actions.save_handle(execution.pk, worker, lease.token, handle)
    execution = actions.fenced_transition(
        execution, State.UNKNOWN, worker=worker, token=lease.token, evidence=Evidence.CONTROLLER_LOST
    )
    return execution


def test_each_failed_check_is_named_and_refuses(place, dead_worker):
    sleeper = subprocess.Popen(["sleep", "1000"], start_new_session=True)
    try:
        me = ProcessIdentity.of(sleeper.pid)
        handle = {"backend": "local", "process": me.to_json(), "marker": "no-such-marker"}
        execution = unknown_execution(place, "local", handle, dead_worker, "still-running")

        with pytest.raises(ResolveRefused) as refused:
            resolve(execution, actor=TEST_ACTOR, note="")
        failed = {check.name for check in refused.value.checks if not check.ok}
        assert failed == {"process", "note"}
        assert "still running" in str(refused.value)

        # Another machine now stands behind the name: a resolve there proves nothing about this one.
        Machine.objects.filter(pk=execution.machine_id).update(incarnation=2)
        sleeper.kill()
        sleeper.wait()
        with pytest.raises(ResolveRefused) as refused:
            resolve(execution, actor=TEST_ACTOR, note="checked")
        assert {c.name for c in refused.value.checks if not c.ok} == {"machine"}
        Machine.objects.filter(pk=execution.machine_id).update(incarnation=1)

        with pytest.raises(ResolveRefused) as refused:  # a note of blanks says nothing either
            resolve(execution, actor=TEST_ACTOR, note="  \t ")
        assert {c.name for c in refused.value.checks if not c.ok} == {"note"}

        resolved, _ = resolve(execution, actor=TEST_ACTOR, note="sleep killed by hand")
        assert resolved.state == State.RESOLVED and resolved.outcome_label == "Resolved: outcome unknown"
        event = ExecutionEvent.objects.get(execution=execution, to_state=State.RESOLVED)
        assert event.actor == TEST_ACTOR.label and event.reason == "sleep killed by hand"
        assert [c["name"] for c in event.detail["checks"]] == ["owner", "machine", "process", "note"]
        assert Machine.objects.get(pk=execution.machine_id).active_execution_id is None
    finally:
        sleeper.kill()


def test_a_live_owner_refuses_until_drained(place):
    stack = Stack()
    try:
        stack.start_worker("tmux")  # alive and beating, but it must not claim the local execution below
        worker = Worker.objects.get(pid=stack.workers[0].pid)
        handle = {"backend": "local", "process": {"pid": 1, "start_time": 0, "boot_id": "gone"}, "marker": "x"}
        machine = place("local", "owned")
        execution, _ = exec_actions.submit_execution(
            scope="team-a", execution_id="owned", machine_name=machine.name, spec=make_spec("true"), actor=TEST_ACTOR
        )
        # As if that live worker held it: its lease, unreleased, and the outcome unknown.
        execution = exec_actions.transition(
            execution,
            State.DISPATCHED,
            evidence=Evidence.CLAIMED,
            actor=TEST_ACTOR,
            ran_on_ref="",
            ran_on_incarnation=1,
        )
        ProcessLease.objects.create(
            execution=execution,
            worker=worker,
            token=7,
            handle=handle,
            expires_at=Now(),
        )
        execution = exec_actions.transition(
            execution, State.UNKNOWN, evidence=Evidence.CONTROLLER_LOST, actor=TEST_ACTOR
        )
        with pytest.raises(ResolveRefused) as refused:
            resolve(execution, actor=TEST_ACTOR, note="looked")
        assert {c.name for c in refused.value.checks if not c.ok} == {"owner"}
        assert "drain it first" in str(refused.value)

        drained = subprocess.run(
            [sys.executable, "manage.py", "drain_worker", worker.worker_id[:10], "--wait", "30"],
            cwd=ROOT,
            env={**os.environ, "DATABASE_URL": stack.env()["DATABASE_URL"]},
            capture_output=True,
            text=True,
        )
        assert drained.returncode == 0, drained.stderr
        assert "stopped" in drained.stdout
        assert stack.workers[0].wait(timeout=30) == 0  # the drained worker exits by itself
        worker.refresh_from_db()
        assert worker.state == WorkerState.STOPPED
        assert list(WorkerEvent.objects.filter(worker=worker).values_list("to_state", flat=True)) == [
            WorkerState.DRAINING,
            WorkerState.STOPPED,
        ]
        resolved, _ = resolve(execution, actor=TEST_ACTOR, note="worker drained; pid 1 is not ours")
        assert resolved.state == State.RESOLVED
    finally:
        stack.stop()


def test_two_operators_resolving_at_once_get_one_winner(place, dead_worker):
    handle = {"backend": "local", "process": {"pid": 1, "start_time": 0, "boot_id": "gone"}, "marker": "none"}
    execution = unknown_execution(place, "local", handle, dead_worker, "raced")

    def attempt(index: int):
        try:
            return resolve(execution, actor=exec_actions.Actor(f"user:op{index}"), note=f"op{index} checked")[0]
        except Exception as error:  # the loser's refusal is the point
            return error
        finally:
            connection.close()

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(attempt, [1, 2]))
    winners = [r for r in results if not isinstance(r, Exception)]
    assert len(winners) == 1, results
    assert "resolved" in str(next(r for r in results if isinstance(r, Exception)))
    assert ExecutionEvent.objects.filter(execution=execution, to_state=State.RESOLVED).count() == 1


def test_sigstop_past_the_ttl_another_worker_adopts_and_the_old_one_is_fenced(terminal, operator):
    """The frozen owner wakes to find its lease taken: its writes are refused and it lets go."""
    stack = Stack()
    stack.extra_env["TETHER_RECOVERY_SECONDS"] = "1"
    try:
        first = stack.start_worker("tmux")
        session, _ = terminal(operator, "tmux")
        lease = wait_for(
            lambda: ProcessLease.objects.filter(execution=session.execution, handle__has_key="pane").first()
        )
        first.send_signal(signal.SIGSTOP)
        second = stack.start_worker("tmux")
        adopted = wait_for(lambda: ProcessLease.objects.filter(pk=lease.pk, token__gt=lease.token).first(), timeout=30)
        assert adopted.worker.pid == second.pid
        first.send_signal(signal.SIGCONT)
        time.sleep(3)
        assert first.poll() is None  # it did not crash; it let go
        lease = ProcessLease.objects.get(pk=lease.pk)
        assert (lease.token, lease.worker_id, lease.released_at) == (adopted.token, adopted.worker_id, None)
        events = ExecutionEvent.objects.filter(execution=session.execution)
        assert events.filter(evidence=Evidence.ADOPTED).count() == 1
        assert not events.filter(to_state__in=[State.COMPLETED, State.UNKNOWN]).exists()
        log = next(stack.log_dir.glob(f"{stack.prefix}-worker-0.log")).read_text()
        assert "lease lost" in log or "lost the lease" in log  # let go: while running, or mid-launch
    finally:
        for process in stack.workers:
            if process.poll() is None:
                process.send_signal(signal.SIGCONT)
        stack.stop()


def test_admin_resolve_form_shows_the_checks_refuses_then_resolves(
    client, django_user_model, operator, place, dead_worker
):
    """The admin form runs the checks itself; a staff member without the permission gets no form at all."""
    from django.urls import reverse

    handle = {"backend": "local", "process": {"pid": 1, "start_time": 0, "boot_id": "gone"}, "marker": "none"}
    execution = unknown_execution(place, "local", handle, dead_worker, "admin-resolve")
    url = reverse("admin:executions_execution_resolve", args=[execution.pk])

    viewer = django_user_model.objects.create_user("viewer", is_staff=True)
    client.force_login(viewer)
    assert client.get(url).status_code == 403

    client.force_login(operator)
    change = client.get(reverse("admin:executions_execution_change", args=[execution.pk]))
    assert "check and resolve" in change.text
    page = client.get(url)
    assert page.status_code == 200
    assert "pid 1 is gone" in page.text  # the process check, as Tether ran it
    refused = client.post(url, {"note": "  "}, follow=True)
    assert "Refused: check failed: note" in refused.text
    assert Execution.objects.get(pk=execution.pk).state == State.UNKNOWN

    done = client.post(url, {"note": "worker gone, pid gone"}, follow=True)
    assert "resolved: outcome unknown, slot freed" in done.text
    event = ExecutionEvent.objects.get(execution=execution, to_state=State.RESOLVED)
    assert event.user == operator and event.reason == "worker gone, pid gone"


def test_with_no_handle_saved_a_process_carrying_the_session_label_refuses(place, dead_worker):
    """An older record kept no handle: the backend finds what carries the execution's session label."""
    execution = unknown_execution(place, "local", {}, dead_worker, "no-handle")
    label = f"{execution.scope}/{execution.execution_id}"
    env = {**os.environ, "TETHER_SESSION": label}
    stray = subprocess.Popen(["sleep", "1000"], env=env, start_new_session=True)
    try:
        with pytest.raises(ResolveRefused) as refused:
            resolve(execution, actor=TEST_ACTOR, note="looked")
        process = next(check for check in refused.value.checks if check.name == "process")
        assert f"pid {stray.pid} carries TETHER_SESSION={label}" in process.detail
    finally:
        stray.kill()
        stray.wait()
    resolved, checks = resolve(execution, actor=TEST_ACTOR, note="the stray sleep was killed")
    assert resolved.state == State.RESOLVED
    assert "nothing the local backend can see carries session label" in checks[2].detail
