"""``manage.py terminal_demo run|shell|delete|interrupt|recover``: Tether's promises, shown end to end.

Modelled on the SmolBox terminal demo. It uses a docker machine (a throwaway
container) when the engine and the image are there, else a tmux machine. Each
phase prints what it proves and fails loudly (exit status 1) when a proof does
not hold. ``interrupt`` leaves a worker killed mid-session; ``recover`` starts a
new one and shows what became of the session: adopted (tmux, or a docker shell
kept by its session holder), or unknown with the slot held (a shell nothing
held, TETHER_HOLDER=0) and then resolved through the checked procedure. Either way the
shell was launched exactly once (a launch counter file).

The viewer here speaks to the owner worker over the channel layer exactly as
the WebSocket consumer does (``demo_console``); with the in-memory layer
(``make run``) the worker runs inside the demo process. Every state a phase can
leave has a next phase that works: ``shell`` and ``recover`` adopt a shell left
running, ``recover`` resolves an unknown one, ``delete`` ends or resolves what
is open before it deletes.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

from channels.db import database_sync_to_async as db
from django.conf import settings

from demo.console import HELP, LayerViewer, console
from demo.world import (
    ACTOR,
    ROOT,
    DemoFailed,
    DemoState,
    InProcessWorker,
    adopted,
    attached_shell,
    counting_shell,
    demo_file,
    demo_machine,
    demo_user,
    ensure_machine,
    launches,
    open_session,
    owner_of,
    prove,
    say,
    slot_holder,
    wait_state,
)
from executions import actions as exec_actions
from executions.models import ENDED_STATES, Evidence, Execution, Machine, MachineState, State
from executions.spec import ExecutionSpec
from terminals import actions
from terminals.backends.procfs import ProcessIdentity
from terminals.models import ProcessLease, TerminalSession
from terminals.resolution import resolve
from terminals.worker import OwnerWorker


async def run(backend: str) -> None:
    say("run: a shell writes a file, is resized and exits 7; the exit is known, the slot freed, the file read back")
    async with attached_shell(backend) as (machine, session, viewer):
        where = demo_file(machine)
        await viewer.type(f"echo tether-demo > {where}; echo wrote-$((40+2))\r")
        prove(await viewer.read_until(b"wrote-42"), "the shell ran the command (wrote-42 echoed back)")
        await viewer.resize(100, 30)
        await viewer.type("stty size\r")
        prove(await viewer.read_until(b"30 100"), "the terminal was resized to 100x30 (stty size says 30 100)")
        await viewer.type("exit 7\r")
        execution = await wait_state(session.execution_id, {State.COMPLETED, State.UNKNOWN})
        prove(
            (execution.state, execution.exit_code) == (State.COMPLETED, 7),
            "the exit is known: completed with exit code 7",
            execution.outcome_label,
        )
        machine = await db(Machine.objects.get)(pk=machine.pk)
        prove(machine.active_execution_id is None, "the machine's command slot is free again")
        read, _ = await db(exec_actions.submit_execution)(
            scope="demo",
            execution_id=f"read-back-{secrets.token_hex(4)}",
            machine_name=machine.name,
            spec=await db(ExecutionSpec.build)(["cat", where]),
            actor=ACTOR,
        )
        read = await wait_state(read.pk, {State.COMPLETED, State.UNKNOWN})
        output = bytes(read.output).replace(b"\r\n", b"\n")
        prove(
            read.exit_code == 0 and output == b"tether-demo\n",
            "a separate command read the file back",
            repr(output),
        )
        if machine.backend != "docker":
            Path(where).unlink(missing_ok=True)
    await delete(backend)


async def delete(backend: str) -> None:
    """Delete the demo machine: an open session is ended first (or, if its outcome is unknown, resolved
    through the checks), then the machine is marked deleted and its container or tmux server removed."""
    machine = await db(demo_machine)()
    if machine is None:
        say("delete: no demo machine")
        return
    say(f"delete: machine {machine.name}")
    if await db(open_session)(machine.pk) or await db(slot_holder)(machine.pk):
        async with InProcessWorker(machine.backend) as worker:
            await _settle_everything(machine, worker)
    machine = await db(exec_actions.set_machine_state)(machine, MachineState.DELETED, actor=ACTOR, reason="demo done")
    prove(machine.state == MachineState.DELETED, "the machine is marked deleted, with its event")
    if machine.backend == "docker":
        subprocess.run(["docker", "rm", "-f", machine.ref], capture_output=True)
        gone = subprocess.run(["docker", "inspect", machine.ref], capture_output=True).returncode != 0
        prove(gone, f"container {machine.ref} no longer exists")
    else:
        subprocess.run(["tmux", "-L", machine.ref, "kill-server"], capture_output=True)
        alive = subprocess.run(["tmux", "-L", machine.ref, "ls"], capture_output=True).returncode == 0
        prove(not alive, f"tmux server {machine.ref} no longer runs")
        Path(DemoState.load().get("counter", "")).unlink(missing_ok=True)
    DemoState.path.unlink(missing_ok=True)


async def _settle_everything(machine: Machine, worker: OwnerWorker) -> None:
    """End what holds the demo machine's slot: a shell this worker holds (after adopting it) is killed; an
    unknown outcome is resolved through Tether's checks."""
    deadline = time.monotonic() + settings.TETHER_LEASE_TTL_SECONDS + 30
    while (holder := await db(slot_holder)(machine.pk)) is not None:
        if time.monotonic() > deadline:
            owner = await db(owner_of)(holder.pk)
            where = f" by worker pid {owner.pid} on {owner.host}" if owner else ""
            raise DemoFailed(f"{holder} is still {holder.state}{where}: stop that worker, then delete again")
        if holder.state == State.UNKNOWN:
            await _resolve(holder, "terminal_demo delete: the demo's shell was lost; ending the demo machine")
            continue
        owner = await db(owner_of)(holder.pk)
        if owner is not None and owner.pk == worker.worker.pk and holder.state == State.RUNNING:
            session = await db(open_session)(machine.pk)
            if session is not None and not await db(_kill_requested)(holder.pk):
                await db(actions.operator_session_action)(session, "kill", actor=ACTOR, reason="demo delete")
        else:
            for line in await worker.recover_once():
                say(f"  recovery: {line}")
        await asyncio.sleep(0.5)
    prove(await db(slot_holder)(machine.pk) is None, "nothing holds the machine's slot any more")


def _kill_requested(execution_pk: int) -> bool:
    return ProcessLease.objects.filter(execution_id=execution_pk, requested_action="kill").exists()


async def _resolve(execution: Execution, note: str) -> None:
    resolved, checks = await db(resolve)(execution, actor=ACTOR, note=note, via="command:terminal_demo")
    for check in checks:
        say(f"    {check}")
    prove(resolved.state == State.RESOLVED, "resolved after Tether's own checks", resolved.outcome_label)


async def shell(backend: str) -> None:
    say(f"shell: type as in any terminal; a line starting with ':' is the demo's: {HELP}")
    async with attached_shell(backend) as (machine, _session, viewer):
        await console(viewer, say, queries_answered=machine.backend == "tmux")


def _worker_env() -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1"}


async def interrupt(backend: str) -> None:
    say("interrupt: a worker holds a shell; it is killed (SIGKILL) mid-session")
    machine = await db(ensure_machine)(backend)
    if holder := await db(slot_holder)(machine.pk):
        raise DemoFailed(f"{holder} ({holder.state}) holds the demo machine: terminal_demo recover or delete first")
    log = open(Path(settings.DATA_DIR) / "terminal-demo-worker.log", "ab")
    worker = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "terminal_worker", "--backends", machine.backend, "--poll", "0.2"],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=_worker_env(),
        start_new_session=True,
    )
    try:
        session, _ = await db(actions.open_terminal)(
            machine, await db(demo_user)(), shell=await db(counting_shell)(machine)
        )
        execution = await wait_state(session.execution_id, {State.RUNNING, State.COMPLETED, State.UNKNOWN})
        owner = await db(owner_of)(execution.pk)
        held_by = f"held by worker pid {owner.pid} on {owner.host}" if owner else "held by no worker"
        prove(
            execution.state == State.RUNNING and owner is not None and owner.pid == worker.pid,
            f"worker pid {worker.pid} runs the shell",
            f"{execution.outcome_label}, {held_by}",
        )
        deadline = time.monotonic() + 15
        while await db(launches)(machine) < 1 and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        prove(await db(launches)(machine) == 1, "the shell was launched once")
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait()
    finally:
        if worker.poll() is None:  # a proof failed before the kill: leave no worker of ours behind
            worker.terminate()
            worker.wait()
    DemoState.save(session=str(session.id), execution=session.execution_id, worker_pid=worker.pid)
    prove(worker.returncode == -signal.SIGKILL, f"worker pid {worker.pid} was killed with SIGKILL")
    owner = await db(owner_of)(execution.pk)
    prove(
        owner is not None and owner.pid == worker.pid and not ProcessIdentity.of(worker.pid),
        "the session has no live owner now: its lease still names the dead worker",
    )
    say("next: manage.py terminal_demo recover")


async def recover(backend: str) -> None:
    """Settle whatever holds the demo machine: a new worker adopts a shell that lived on (tmux, held) and a viewer
    types into it, or records the outcome unknown, which is then resolved through Tether's checks."""
    machine = await db(demo_machine)()
    holder = await db(slot_holder)(machine.pk) if machine else None
    if holder is None:
        say("recover: nothing holds the demo machine: nothing to recover (next: run, shell, interrupt or delete)")
        return
    say(f"recover: a worker starts, finds {holder}'s dead owner once its lease expires, and settles it")
    counted = DemoState.load().get("execution") == holder.pk
    async with InProcessWorker(machine.backend) as worker:
        deadline = time.monotonic() + settings.TETHER_LEASE_TTL_SECONDS + 30
        while True:
            for line in await worker.recover_once():
                say(f"  recovery: {line}")
            execution = await db(Execution.objects.select_related("machine").get)(pk=holder.pk)
            owner = await db(owner_of)(execution.pk)
            ours = owner is not None and owner.pk == worker.worker.pk
            if execution.state in ENDED_STATES or ours:
                break  # pending or dispatched: a worker (this one, say) has yet to take it
            if time.monotonic() > deadline:
                where = f"worker pid {owner.pid} on {owner.host}" if owner else "no worker"
                raise DemoFailed(f"{execution} is still {execution.state}, held by {where}: drain or stop it first")
            await asyncio.sleep(1)
        if ours and await db(adopted)(execution.pk):
            prove(execution.state == State.RUNNING, "the shell was adopted: still running, with an adopted event")
            session = await db(TerminalSession.objects.get)(execution=execution)
            viewer = LayerViewer(session)
            await viewer.attach()
            await viewer.type("echo still-here-$((6*7))\r")
            prove(await viewer.read_until(b"still-here-42"), "a viewer reattached to the same shell and typed into it")
            await viewer.type("exit 0\r")
            execution = await wait_state(execution.pk, {State.COMPLETED, State.UNKNOWN})
            prove(execution.exit_code == 0, "its exit was observed by the new owner", execution.outcome_label)
        elif execution.state == State.UNKNOWN:
            prove(
                execution.evidence == Evidence.CONTROLLER_LOST,
                "nothing could observe it: the outcome is unknown",
                execution.evidence,
            )
            machine = await db(Machine.objects.get)(pk=machine.pk)
            prove(machine.active_execution_id == execution.pk, "the slot stays held until an operator resolves it")
            await _resolve(execution, "demo: worker killed; recovery ended the unobservable shell")
            machine = await db(Machine.objects.get)(pk=machine.pk)
            prove(machine.active_execution_id is None, "the slot is free again")
        else:
            say(f"  {execution}: {execution.outcome_label}")
    if counted:
        count = await db(launches)(machine)
        prove(count == 1, "the shell was launched exactly once", f"launch counter: {count}")
    DemoState.save(execution=None, session=None)
