"""An owner dies between claiming a command and its program starting: known when provable, else unknown.

Each worker here SIGKILLs itself at a named point of its launch (``TETHER_FAULT_POINTS``), so the crash
lands exactly in the window, on every backend. A later worker's recovery then says what became of it:
never started (a final outcome that frees the slot) where the backend proves it, unknown elsewhere.
"""

from __future__ import annotations

import signal
import subprocess
import time

import pytest

from executions import actions as exec_actions
from executions.models import Evidence, Execution, Machine, State
from terminals.backends.procfs import ProcessIdentity, find_tree
from terminals.models import ProcessLease
from terminals.resolution import resolve
from tests.bridge.harness import Stack, wait_for
from tests.factories import TEST_ACTOR, make_spec
from tests.faults.test_worker_crash import Place

pytestmark = [pytest.mark.faults, pytest.mark.django_db(transaction=True)]

# (backend, where the owner dies, what recovery can prove)
CASES = [
    ("local", "launch.claimed", Evidence.NEVER_STARTED),
    ("tmux", "launch.claimed", Evidence.NEVER_STARTED),
    ("docker", "launch.claimed", Evidence.NEVER_STARTED),
    # The intent is saved; the backend was not asked yet. tmux finds no session with its marker on the
    # same server; docker starts an exec only once its id is kept; a local fork leaves nothing to tell by.
    ("local", "launch.spawning", Evidence.CONTROLLER_LOST),
    ("tmux", "launch.spawning", Evidence.NEVER_STARTED),
    ("docker", "launch.spawning", Evidence.NEVER_STARTED),
    # The exec is created and its handle kept, but never started.
    ("docker", "launch.starting", Evidence.NEVER_STARTED),
]


def test_an_owner_killed_before_its_program_starts_leaves_an_honest_record(place, tmp_path, request):
    stack = Stack()
    stack.extra_env["TETHER_RECOVERY_SECONDS"] = "1"
    machines = {backend: place(backend, f"window-{backend}") for backend in ("local", "tmux", "docker")}
    executions = []
    try:
        for n, (backend, point, _) in enumerate(CASES):
            machine = machines[backend]
            # One machine per case: a copy of the backend's machine, so an unknown holds only its own slot.
            copy = exec_actions.add_machine(
                name=f"{machine.name}-{n}", backend=backend, ref=machine.ref, scope="team-a", actor=TEST_ACTOR
            )
            where = Place(backend, tmp_path, machine.ref if backend == "docker" else None)
            where.path = f"{where.path}-{n}"
            stack.extra_env["TETHER_FAULT_POINTS"] = point
            owner = stack.start_worker(backend)
            execution, _ = exec_actions.submit_execution(
                scope="team-a",
                execution_id=f"window-{n}",
                machine_name=copy.name,
                spec=make_spec("sh", "-c", f"echo ran >> {where.path}"),
                actor=TEST_ACTOR,
            )
            assert owner.wait(timeout=30) == -9, f"the owner did not die at {point}"
            lease = ProcessLease.objects.get(execution=execution)
            assert lease.worker.pid == owner.pid and lease.released_at is None
            executions.append((execution, where))

        stack.extra_env.pop("TETHER_FAULT_POINTS")
        stack.start_worker("local,tmux,docker")
        for (execution, where), (backend, point, evidence) in zip(executions, CASES, strict=True):
            settled = wait_for(
                lambda pk=execution.pk: Execution.objects.filter(
                    pk=pk, state__in=[State.COMPLETED, State.UNKNOWN]
                ).first(),
                timeout=40,
                what=f"{backend} killed at {point} to be settled",
            )
            assert settled.evidence == evidence, (backend, point, settled.evidence, settled.events.last().reason)
            assert where.read() == "", f"{backend} at {point}: the program ran"
            slot = Machine.objects.get(pk=settled.machine_id).active_execution_id
            if evidence == Evidence.NEVER_STARTED:
                assert settled.state == State.COMPLETED and slot is None
                assert settled.outcome_label == "Never started: its worker stopped before starting it"
            else:
                # Nothing proves it did not run: the slot stays held until an operator resolves it, and
                # the checks can pass (nothing carries its marker on this host).
                assert settled.state == State.UNKNOWN and slot == settled.pk
                resolved, _ = resolve(settled, actor=TEST_ACTOR, note="owner killed before its fork")
                assert resolved.state == State.RESOLVED
    finally:
        stack.stop()


@pytest.mark.parametrize(
    ("backend", "point", "proven"),
    [
        # tmux: the woken owner would go on to create the session: its freezing proves nothing.
        ("tmux", "launch.spawning", False),
        # docker: it starts an exec only after a fenced write of its id, which a take-over makes fail.
        ("docker", "launch.spawning", True),
        # docker, the exec created and its id kept: the woken owner goes straight on to start it.
        ("docker", "launch.starting", False),
    ],
)
def test_an_owner_frozen_before_its_program_starts_proves_nothing_unless_its_next_step_is_fenced(
    place, tmp_path, backend, point, proven
):
    """Frozen (SIGSTOP), not gone: where it may wake and start the program, recovery records unknown, and
    the owner, waking to find its lease taken and nobody holding what it started, ends it."""
    machine = place(backend, f"frozen-{backend}")
    where = Place(backend, tmp_path, machine.ref if backend == "docker" else None)
    stack = Stack()
    stack.extra_env["TETHER_RECOVERY_SECONDS"] = "1"
    try:
        stack.extra_env["TETHER_FAULT_POINTS"] = f"{point}:stop"
        frozen = stack.start_worker(backend)
        execution, _ = exec_actions.submit_execution(
            scope="team-a", execution_id=f"frozen-{backend}", machine_name=machine.name, actor=TEST_ACTOR,
            spec=make_spec("sh", "-c", f"echo started >> {where.path}; sleep 60"),
        )  # fmt: skip
        wait_for(lambda: ProcessIdentity.of(frozen.pid).is_stopped(), what="the owner to freeze at the point")
        stack.extra_env.pop("TETHER_FAULT_POINTS")
        stack.start_worker(backend)
        settled = wait_for(
            lambda: Execution.objects.filter(pk=execution.pk, state__in=[State.COMPLETED, State.UNKNOWN]).first(),
            timeout=40,
            what="recovery to settle it",
        )
        marker = ProcessLease.objects.get(execution=execution).handle.marker
        frozen.send_signal(signal.SIGCONT)  # it wakes and carries on from where it stopped
        if proven:
            assert (settled.state, settled.evidence) == (State.COMPLETED, Evidence.NEVER_STARTED)
            time.sleep(3)
            assert where.read() == "" and not marked(backend, machine.ref, marker)  # and it never does
        else:
            assert (settled.state, settled.evidence) == (State.UNKNOWN, Evidence.CONTROLLER_LOST)
            assert "may still start it" in settled.events.get(to_state=State.UNKNOWN).reason
            wait_for(lambda: where.read() == "started\n", what="the woken owner to start the program")
            wait_for(lambda: not marked(backend, machine.ref, marker), timeout=20, what="the woken owner to end it")
        assert frozen.poll() is None  # it let go, and serves on
    finally:
        for process in stack.workers:
            if process.poll() is None:
                process.send_signal(signal.SIGCONT)
        stack.stop()


def marked(backend: str, container: str, marker: str) -> bool:
    """Whether a process carrying ``marker`` still runs (in the container, for docker)."""
    if backend == "docker":
        found = subprocess.run(
            ["docker", "exec", container, "sh", "-c", f"grep -l {marker} /proc/[0-9]*/environ 2>/dev/null"],
            capture_output=True,
            text=True,
        )
        return bool(found.stdout.strip())
    return bool(find_tree(marker=marker))
