"""The worker's buffer and the session holder's ring work together for any sizes: a buffer as large as the
ring (or larger) once left the holder unacknowledged, full at about 1,048,000 bytes, and the shell frozen
(Ctrl-C brought nothing, Kill left it live for 60 s)."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async

from executions.models import Execution, State
from terminals.models import ProcessLease
from tests.bridge.harness import Stack, Viewer

pytestmark = [pytest.mark.faults, pytest.mark.django_db(transaction=True)]

MIB = 1024 * 1024


@pytest.mark.parametrize(
    ("backend", "buffer", "ring"),
    [("local", 4 * MIB, MIB), ("local", MIB, MIB), ("local", 128 * 1024, 256 * 1024), ("docker", 4 * MIB, MIB)],
)
async def test_a_held_shell_streams_past_its_ring_whatever_the_buffer_then_ends_when_killed(
    terminal, operator, backend, buffer, ring
):
    stack = Stack()
    stack.extra_env |= {"TETHER_BUFFER_BYTES": str(buffer), "TETHER_HOLDER_RING_BYTES": str(ring)}
    try:
        await sync_to_async(stack.start)(backend)
        session, cookie = await sync_to_async(terminal)(operator, backend)
        viewer = await Viewer.open(stack.ports[0], session.id, cookie)
        await viewer.attach(cols=120, rows=40)
        lease = await sync_to_async(ProcessLease.objects.get)(execution_id=session.execution_id)
        assert lease.handle.holder is not None
        # About 3.2 MB: three times the ring, and under a 4 MiB buffer.
        await viewer.type("seq 1 450000; echo STREAMED-$((6*7))\r")
        await viewer.read_until(b"STREAMED-42", timeout=90)
        assert viewer.offset > 3_000_000

        # Still a live shell: it answers, and an operator's Kill ends it at once, with its end recorded.
        await viewer.type("echo ALIVE-$((5*5))\r")
        await viewer.read_until(b"ALIVE-25", timeout=20)
        await viewer.send_json({"type": "reset"})
        exit = await viewer.wait_for("exit", timeout=20)
        assert exit["state"] == State.COMPLETED and exit["reason"] == "reset", exit
        ended = await sync_to_async(Execution.objects.get)(pk=session.execution_id)
        assert ended.state == State.COMPLETED
    finally:
        await sync_to_async(stack.stop)()
