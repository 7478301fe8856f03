"""recover_terminals: a dry run lists and changes nothing; a real run settles dead owners' leases and removes only
tagged tmux sessions nobody owns (never untagged ones, never those of a live owner)."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from asgiref.sync import async_to_sync
from django.db.models.functions import Now

from executions import actions as exec_actions
from executions.models import Evidence, Execution, State
from terminals import actions
from terminals.backends.base import SpawnSpec, Tags
from terminals.backends.handles import LocalHandle
from terminals.backends.procfs import ProcessIdentity
from terminals.backends.tmux import TmuxBackend
from terminals.models import ProcessLease, Worker
from tests.bridge.harness import database_url
from tests.factories import TEST_ACTOR, make_spec
from tests.faults.test_resolution import register

pytestmark = [pytest.mark.faults, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]


def manage(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DATABASE_URL": database_url()}
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


def gone_identity() -> ProcessIdentity:
    child = subprocess.Popen(["true"])
    identity = ProcessIdentity.of(child.pid)
    child.wait()
    return identity


def sessions(socket: str) -> set[str]:
    listed = subprocess.run(["tmux", "-L", socket, "list-sessions", "-F", "#{session_name}"], capture_output=True)
    return set(listed.stdout.decode().split())


def test_dry_run_lists_then_recovery_settles_and_removes_only_orphans(place, tmux_socket):
    place("tmux", "orphans")  # recovery looks at the sockets of tmux machines
    backend = TmuxBackend(tmux_socket)
    dead, me = gone_identity(), ProcessIdentity.of(os.getpid())

    async def leave_running(tags: Tags):
        process = await backend.spawn(SpawnSpec(argv=("sleep", "1000")), tags)
        await process.detach()  # as a worker that died would: the session stays
        return process

    orphan = async_to_sync(leave_running)(Tags("left-behind", dead.pid, dead.start_time))
    mine = async_to_sync(leave_running)(Tags("live-owner", me.pid, me.start_time))
    subprocess.run(["tmux", "-L", tmux_socket, "new-session", "-d", "-s", "untagged", "sleep 1000"], check=True)

    # A local execution whose owner died with it: nothing can say how it ended.
    owner = register(dead.pid, dead.start_time)
    local = place("local", "lost-local")
    exec_actions.submit_execution(
        scope="team-a", execution_id="lost", machine_name=local.name, spec=make_spec("true"), actor=TEST_ACTOR
    )
    execution, lease = actions.claim_next_execution(owner, {"local"})
    gone = gone_identity()
    actions.save_handle(execution.pk, owner, lease.token, LocalHandle(process=gone, marker="m" * 24))
    ProcessLease.objects.filter(pk=lease.pk).update(expires_at=Now() - timedelta(minutes=1))
    Worker.objects.filter(pk=owner.pk).update(lease_until=Now() - timedelta(minutes=1))  # nor its heartbeat

    dry = manage("recover_terminals", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert f"would remove   tmux session {orphan.handle.session}" in dry.stdout
    assert "would unknown  team-a/lost [local]" in dry.stdout
    assert "live-owner" not in dry.stdout and "untagged" not in dry.stdout
    assert Execution.objects.get(pk=execution.pk).state == State.DISPATCHED
    assert orphan.handle.session in sessions(tmux_socket)

    real = manage("recover_terminals")
    assert real.returncode == 0, real.stderr
    left = sessions(tmux_socket)
    assert orphan.handle.session not in left
    assert {mine.handle.session, "untagged"} <= left
    execution = Execution.objects.get(pk=execution.pk)
    assert (execution.state, execution.evidence) == (State.UNKNOWN, Evidence.CONTROLLER_LOST)
    assert Execution.objects.get(pk=execution.pk).machine.active_execution_id == execution.pk  # the slot stays taken
    again = manage("recover_terminals", "--dry-run")
    assert "nothing to recover" in again.stdout
