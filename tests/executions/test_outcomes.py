"""An outcome claims exactly what its source knows: a signal death where it was seen as one, an ambiguous wait
status where the backend cannot tell a signal from an exit code."""

from __future__ import annotations

import asyncio
import time

import pytest
from asgiref.sync import sync_to_async

from executions import actions as exec_actions
from executions.models import Evidence, Execution, State
from terminals.worker import OwnerWorker
from tests.factories import TEST_ACTOR, make_spec

pytestmark = pytest.mark.django_db(transaction=True)


async def run_to_the_end(place, backend: str, *argv: str) -> Execution:
    machine = await sync_to_async(place)(backend)
    execution, _ = await sync_to_async(exec_actions.submit_execution)(
        scope="team-a", execution_id=f"{backend}-1", machine_name=machine.name, spec=make_spec(*argv), actor=TEST_ACTOR
    )
    worker = OwnerWorker(backends={backend})
    await worker.start()
    try:
        assert await worker.handle_one_step()
        deadline = time.monotonic() + 30
        while (done := await sync_to_async(Execution.objects.get)(pk=execution.pk)).state not in (
            State.COMPLETED,
            State.UNKNOWN,
        ):
            assert time.monotonic() < deadline, f"still {done.state}"
            await asyncio.sleep(0.05)
        return done
    finally:
        await worker.shutdown()


@pytest.mark.parametrize("backend", ["local", "tmux", "docker"])
async def test_a_signal_death_is_told_as_the_signal_where_it_was_seen(place, backend):
    """On the host (waitpid, tmux's pane status), and in a container by its session holder."""
    done = await run_to_the_end(place, backend, "sh", "-c", "kill -9 $$")
    assert (done.state, done.evidence, done.exit_signal, done.exit_code) == (
        State.COMPLETED,
        Evidence.SIGNALED,
        9,
        None,
    )
    assert done.outcome_label == "Ended by signal 9"


async def test_docker_cannot_tell_a_sigkill_from_exit_137_and_the_record_says_so(place, settings):
    settings.TETHER_HOLDER = False  # a plain exec: only docker's own exit code to go by
    done = await run_to_the_end(place, "docker", "sh", "-c", "kill -9 $$")
    assert (done.state, done.evidence, done.exit_code, done.exit_signal) == (
        State.COMPLETED,
        Evidence.EXIT_STATUS,
        137,
        None,
    )
    assert done.outcome_label == "Exit status 137 (128+9: SIGKILL or exit 137; docker cannot tell)"
    ended = await sync_to_async(done.events.get)(to_state=State.COMPLETED)
    assert "docker cannot tell" in ended.reason


async def test_a_plain_docker_exit_code_stays_a_known_exit(place):
    done = await run_to_the_end(place, "docker", "sh", "-c", "exit 7")
    assert (done.evidence, done.exit_code, done.outcome_label) == (Evidence.EXITED, 7, "Exited with code 7")
