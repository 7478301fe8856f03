"""PostgreSQL restarts under a live session: typing and output go on, and the worker's heartbeats resume."""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path

import pytest
from asgiref.sync import SyncToAsync, async_to_sync, sync_to_async
from django.db import connection, connections

from executions.models import Execution, State
from terminals.models import Worker
from tests.bridge.harness import Stack, open_viewer

# It restarts the PostgreSQL every test uses.
pytestmark = [pytest.mark.faults, pytest.mark.exclusive, pytest.mark.django_db(transaction=True)]


def restart_postgresql() -> None:
    version = sorted(Path("/etc/postgresql").iterdir(), key=lambda p: float(p.name))[-1].name
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "restart", "-m", "fast"],
        check=True,
        capture_output=True,
        timeout=60,
    )


def heartbeat_of(pid: int):
    connection.close()  # the restart broke this connection; take a fresh one
    for _ in range(100):
        try:
            return Worker.objects.get(pid=pid).heartbeat_at
        except Exception:  # still starting up
            connection.close()
            time.sleep(0.1)
    raise AssertionError("PostgreSQL did not come back")


def test_postgresql_restart_during_a_live_session(terminal, operator):
    # Sync on the outside, so every database call below runs on this thread: its connection, broken by
    # the restart, is the one pytest-django flushes with afterwards.
    try:
        async_to_sync(_restart_during_a_live_session)(terminal, operator)
    finally:
        # Async tests reach the database from asgiref's one shared thread; the restart killed that
        # thread's connection too: close it, so the next test connects afresh instead of failing.
        SyncToAsync.single_thread_executor.submit(connections.close_all).result(timeout=30)


async def _restart_during_a_live_session(terminal, operator):
    stack = Stack()
    try:
        await sync_to_async(stack.start_daphne)()
        worker = await sync_to_async(stack.start_worker)("local")
        viewer, session, _ = await open_viewer(stack, terminal, operator)
        before = await sync_to_async(heartbeat_of)(worker.pid)

        restart = asyncio.create_task(asyncio.to_thread(restart_postgresql))
        for n in range(20):  # type through the outage: every line comes back, none twice
            await viewer.type(f"echo line-$((1000+{n}))\r")
            await viewer.read_until(f"line-{1000 + n}\r\n".encode(), timeout=15)
            await asyncio.sleep(0.1)
        await restart

        deadline = time.monotonic() + 20
        while await sync_to_async(heartbeat_of)(worker.pid) <= before:
            assert time.monotonic() < deadline, "the worker's heartbeat did not resume"
            await asyncio.sleep(0.5)
        await viewer.type("echo still-$((6*7))\r")
        await viewer.read_until(b"still-42\r\n")
        for n in range(20):
            assert viewer.output.count(f"line-{1000 + n}\r\n".encode()) == 1
        execution = await sync_to_async(Execution.objects.get)(pk=session.execution_id)
        assert execution.state == State.RUNNING
        assert worker.poll() is None
        await viewer.close()
    finally:
        await sync_to_async(stack.stop)()
