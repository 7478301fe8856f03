"""A session holder that outlives its settled command: the worker recorded `completed/exited 3` and was SIGKILLed
before it let the holder go; the holder (its exit record, its socket, its ring) was still there 56 minutes
later, with no worker ever coming back for it. Recovery ends the holders of settled executions, on the host and
in containers, and counts them (`tether_holders_swept_total`)."""

from __future__ import annotations

import os
import subprocess
import time
import urllib.request

import pytest
from asgiref.sync import sync_to_async

from executions.models import Execution, State
from terminals.backends.handles import Handle
from terminals.models import ProcessLease
from tests.bridge.harness import Stack, free_port
from tests.factories import make_execution, make_spec

pytestmark = [pytest.mark.faults, pytest.mark.django_db(transaction=True)]


def holder_running(backend: str, handle: Handle) -> bool:
    """As ps sees it: the holder's process is there and no zombie."""
    if backend == "docker":
        pid = str(handle.holder.pid)
        listing = subprocess.run(["docker", "exec", handle.container, "ps", "-o", "pid,stat"],
                                 capture_output=True, text=True, timeout=30).stdout  # fmt: skip
        return any(line.split()[0] == pid and not line.split()[1].startswith("Z") for line in listing.splitlines()[1:])
    try:
        with open(f"/proc/{handle.holder.process.pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def swept(port: int, backend: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(f'tether_holders_swept_total{{backend="{backend}"}}'):
                return float(line.split()[-1])
    return 0.0


@pytest.mark.parametrize("backend", ["local", "docker"])
async def test_a_holder_that_outlived_its_settled_command_is_ended_by_recovery_and_counted(place, backend):
    stack = Stack()
    stack.extra_env |= {"TETHER_RECOVERY_SECONDS": "1", "TETHER_HOLDER_SWEEP_SECONDS": "1"}
    try:
        # The first worker records the outcome and dies at once, before it lets the holder go.
        first = await sync_to_async(stack.start_worker)(backend, env={"TETHER_FAULT_POINTS": "settle.recorded"})
        machine = await sync_to_async(place)(backend)
        spec = make_spec("sh", "-c", "echo done; exit 3")
        execution = await sync_to_async(make_execution)(machine, execution_id=f"sweep-{backend}", spec=spec)
        await sync_to_async(first.wait)(timeout=60)
        recorded = await sync_to_async(Execution.objects.get)(pk=execution.pk)
        assert (recorded.state, recorded.exit_code) == (State.COMPLETED, 3)
        lease = await sync_to_async(ProcessLease.objects.get)(execution_id=execution.pk)
        time.sleep(2)
        assert holder_running(backend, lease.handle)  # left behind: nothing would ever come for it
        if backend == "local":
            assert os.path.isdir(lease.handle.holder.dir)

        port = free_port()
        await sync_to_async(stack.start_worker)(backend, env={"TETHER_WORKER_HTTP": f"127.0.0.1:{port}"})
        deadline = time.monotonic() + 30
        while holder_running(backend, lease.handle):
            assert time.monotonic() < deadline, "the holder of a settled command is still running"
            time.sleep(0.5)
        while swept(port, backend) != 1.0:
            assert time.monotonic() < deadline, swept(port, backend)
            time.sleep(0.5)
        lease = await sync_to_async(ProcessLease.objects.get)(execution_id=execution.pk)
        assert lease.holder_ended_at is not None
        if backend == "local":
            assert not os.path.exists(lease.handle.holder.dir)
        recorded = await sync_to_async(Execution.objects.get)(pk=execution.pk)
        assert (recorded.state, recorded.exit_code) == (State.COMPLETED, 3)  # the record is left as it was
    finally:
        await sync_to_async(stack.stop)()
