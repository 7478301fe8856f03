"""Held shells under the worst timing: the owner killed with SIGKILL while its shell streams 20 MB to a viewer.
The next worker adopts the same shell from its session holder, the viewer's socket is re-attached where it
was, every byte arrives once (the hash matches), and the shell's own exit is recorded."""

from __future__ import annotations

import hashlib
import re

import pytest
from asgiref.sync import sync_to_async
from websockets.exceptions import ConnectionClosed

from executions.models import Evidence, Execution, ExecutionEvent, State
from terminals.backends.handles import DockerHandle, LocalHandle
from terminals.models import ProcessLease
from tests.bridge.harness import Stack, Viewer

pytestmark = [pytest.mark.faults, pytest.mark.django_db(transaction=True)]

STREAM = 15_000_000  # bytes of randomness: 20 MB of base64


def _lease(execution_pk: int) -> ProcessLease | None:
    return ProcessLease.objects.filter(execution_id=execution_pk, released_at__isnull=True).first()


def _shell_pid(handle: LocalHandle | DockerHandle) -> int:
    """The held shell's pid: on this host's /proc (local), or in its container's namespace (docker)."""
    return handle.process.pid if handle.process is not None else handle.holder.program


@pytest.mark.parametrize("backend", ["local", "docker"])
async def test_kill_9_mid_stream_then_the_adopter_delivers_every_byte_once_and_the_exit(terminal, operator, backend):
    stack = Stack()
    stack.extra_env["TETHER_RECOVERY_SECONDS"] = "1"
    stack.extra_env["TETHER_VIEWER_CHECK_SECONDS"] = "1"
    try:
        await sync_to_async(stack.start_daphne)()
        first = await sync_to_async(stack.start_worker)(backend)
        session, cookie = await sync_to_async(terminal)(operator, backend)
        viewer = await Viewer.open(stack.ports[0], session.id, cookie)
        attached = await viewer.attach(cols=120, rows=40)
        await viewer.type("stty -echo -opost; echo shell-$$-ready\r")
        shell_pid = (await viewer.read_match(rb"shell-(\d+)-ready\n")).group(1)
        lease = await sync_to_async(_lease)(session.execution_id)
        assert lease.handle.holder is not None
        script = (
            f'f=$(mktemp); head -c {STREAM} /dev/urandom | base64 > $f; echo "<<$(sha256sum < $f | cut -c1-64)>>";'
            " echo '<<BEGIN>>'; cat $f; echo '<<END>>'; rm -f $f; sleep 1; exit 3\r"
        )
        await viewer.type(script)
        expected = (await viewer.read_match(rb"<<([0-9a-f]{64})>>\n<<BEGIN>>\n", timeout=60)).group(1).decode()
        start = viewer.output.index(b"<<BEGIN>>\n") + len(b"<<BEGIN>>\n")
        while len(viewer.output) - start < 4_000_000:  # well into the stream
            await viewer.read_for(0.05)
        first.kill()
        await sync_to_async(first.wait)()
        await sync_to_async(stack.start_worker)(backend)

        again = await viewer.wait_for("attached", timeout=60)
        before = len(viewer.output)  # what had arrived before the re-attach (its first offset was 0)
        # The same shell (its holder's offsets) resumes where this viewer was: no replay, no gap.
        assert again["generation"] == attached["generation"] and not again["fresh"], again
        assert again["lost"] == 0 and again["offset"] <= before, (again, before)
        await viewer.read_until(b"<<END>>\n", timeout=120)
        output = bytes(viewer.output)
        # What the re-attach sent again from before this viewer's offset is the same bytes (a page skips
        # them by offset, as the harness does not): the stream once, in order.
        resent = before - again["offset"]
        assert output[before : before + resent] == output[again["offset"] : before]
        output = output[:before] + output[before + resent :]
        body = output[start : output.index(b"<<END>>\n", start)]
        assert hashlib.sha256(body).hexdigest() == expected

        try:
            exit = await viewer.wait_for("exit", timeout=30)
        except ConnectionClosed:
            # The socket closed before this client read the exit (its acks crossing the close can reset the
            # connection): a page reconnects and is told at its attach.
            viewer = await Viewer.open(stack.ports[0], session.id, cookie)
            await viewer.send_json({"type": "attach", "since": 0, "generation": attached["generation"]})
            exit = await viewer.wait_for("exit", timeout=30)
        assert exit["exit_code"] == 3 and exit["generation"] == attached["generation"], exit
        execution = await sync_to_async(Execution.objects.get)(pk=session.execution_id)
        assert (execution.state, execution.evidence, execution.exit_code) == (State.COMPLETED, Evidence.EXITED, 3)
        adopted = await sync_to_async(
            ExecutionEvent.objects.filter(execution_id=execution.pk, evidence=Evidence.ADOPTED).exists
        )()
        assert adopted
        final = await sync_to_async(ProcessLease.objects.get)(execution_id=execution.pk, token__gt=lease.token)
        assert _shell_pid(final.handle) == _shell_pid(lease.handle)  # the same shell process
        assert re.fullmatch(rb"\d+", shell_pid) and int(shell_pid) == _shell_pid(lease.handle)
        await viewer.close()
    finally:
        await sync_to_async(stack.stop)()
