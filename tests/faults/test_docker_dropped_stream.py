"""A docker command's owner is killed while the command prints: no made-up exit, ever.

When its client goes away while dockerd is writing to it, docker drops the exec: it records 126 and hangs
up the terminal, so the program dies without reaching its exit. A new worker must not read that 126 back
as the program's exit: the outcome is unknown unless the program's own exit was seen.
"""

from __future__ import annotations

import random
import signal
import subprocess

import pytest

from executions import actions as exec_actions
from executions.models import Evidence, Execution, State
from terminals.models import ProcessLease
from tests.bridge.harness import Stack, wait_for
from tests.factories import TEST_ACTOR, make_spec

pytestmark = [pytest.mark.faults, pytest.mark.django_db(transaction=True)]

TRIALS = 6
# About 20 MB of base64, then a file written just before the program's own exit (code 3).
PRINTS_THEN_EXITS = "head -c 15000000 /dev/urandom | base64; echo reached > /tmp/reached-{n}; exit 3"


def reached_its_exit(container: str, n: int) -> bool:
    found = subprocess.run(["docker", "exec", container, "cat", f"/tmp/reached-{n}"], capture_output=True, text=True)
    return found.stdout == "reached\n"


def test_killing_the_owner_mid_stream_never_records_an_exit_the_program_did_not_make(container):
    """A plain exec (no session holder: where the holder cannot run). Held shells never lose their stream
    with their owner (test_held_streams.py)."""
    stack = Stack()
    stack.extra_env["TETHER_RECOVERY_SECONDS"] = "1"
    stack.extra_env["TETHER_HOLDER"] = "0"
    executions = []
    try:
        for n in range(TRIALS):
            # One machine per trial over the same container: an unknown outcome keeps its own slot.
            machine = exec_actions.add_machine(
                name=f"stream-{n}", backend="docker", ref=container, scope="team-a", actor=TEST_ACTOR
            )
            owner = stack.start_worker("docker")
            execution, _ = exec_actions.submit_execution(
                scope="team-a",
                execution_id=f"stream-{n}",
                machine_name=machine.name,
                spec=make_spec("sh", "-c", PRINTS_THEN_EXITS.format(n=n)),
                actor=TEST_ACTOR,
            )
            executions.append(execution)
            wait_for(
                lambda pk=execution.pk, pid=owner.pid: ProcessLease.objects.filter(
                    execution_id=pk, worker__pid=pid, execution__state=State.RUNNING
                ).exists(),
                what="the owner to hold the running exec",
            )
            # A moment within the stream (20 MB take docker 0.4 s at 50 MB/s). The owner stops reading first, as
            # a dying or swapped-out process does, so dockerd is writing into a full socket when it goes: that
            # is when docker drops the exec and records 126 (a kill between two writes leaves it running).
            subprocess.run(["sleep", f"{random.uniform(0.02, 0.3):.2f}"])
            owner.send_signal(signal.SIGSTOP)
            subprocess.run(["sleep", "0.1"])
            owner.send_signal(signal.SIGKILL)
            owner.wait()
        stack.start_worker("docker")  # the survivor settles every trial

        wrong, cut_short = [], 0
        for execution in executions:
            settled = wait_for(
                lambda pk=execution.pk: Execution.objects.filter(
                    pk=pk, state__in=[State.COMPLETED, State.UNKNOWN]
                ).first(),
                timeout=60,
                what=f"{execution} to be settled",
            )
            n = int(execution.execution_id.split("-")[1])
            reached = reached_its_exit(container, n)
            cut_short += not reached
            if settled.state == State.COMPLETED and not (
                reached and settled.evidence == Evidence.EXITED and settled.exit_code == 3
            ):
                wrong.append(f"{settled}: {settled.outcome_label} ({settled.evidence}), reached its exit: {reached}")
        assert not wrong, f"{len(wrong)} of {TRIALS} outcomes were made up: {wrong}"
        assert cut_short >= TRIALS // 2, f"docker dropped only {cut_short} of {TRIALS} execs: the fault was not met"
    finally:
        stack.stop()
