"""``manage.py terminal_demo run|shell|delete|interrupt|recover``: Tether's promises, shown end to end.

Modelled on the SmolBox terminal demo. It uses a docker machine (a throwaway
container) when the engine and the image are there, else a tmux machine. Each
phase prints what it proves and fails loudly (exit status 1) when a proof does
not hold. ``interrupt`` leaves a worker killed mid-session; ``recover`` starts a
new one and shows what became of the session: adopted (tmux), or unknown with
the slot held and then resolved through the checked procedure. Either way the
shell was launched exactly once (a launch counter file).

The viewer here speaks to the owner worker over the channel layer exactly as
the WebSocket consumer does; with the in-memory layer (``make run``) the worker
runs inside the demo process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from channels.db import database_sync_to_async as db
from channels.layers import get_channel_layer
from django.conf import settings
from django.contrib.auth import get_user_model

from executions import actions as exec_actions
from executions.actions import Actor
from executions.models import Execution, Machine, MachineState, State
from executions.spec import ExecutionSpec
from terminals import actions
from terminals.models import ProcessLease, TerminalSession
from terminals.resolution import resolve
from terminals.worker import OwnerWorker

ACTOR = Actor.command("terminal_demo")
IMAGE = os.environ.get("TETHER_DEMO_IMAGE", "tether/busybox:test")
PREFIX = os.environ.get("TETHER_DEMO_PREFIX", "tether-demo")  # machine, container and tmux socket names
LABEL = os.environ.get("TETHER_DEMO_LABEL", "tether.demo=1")
ROOT = Path(__file__).resolve().parent.parent


class DemoFailed(Exception):
    pass


def prove(condition: bool, claim: str, detail: str = "") -> None:
    if not condition:
        raise DemoFailed(f"NOT PROVEN: {claim}{f' ({detail})' if detail else ''}")
    print(f"  proven: {claim}{f' ({detail})' if detail else ''}", flush=True)


def say(text: str) -> None:
    print(text, flush=True)


# --- the demo's machine and its state between phases ------------------------------------------


class DemoState:
    """What one phase leaves for the next, in the data directory."""

    path = Path(settings.DATA_DIR) / "terminal-demo.json"

    @classmethod
    def load(cls) -> dict:
        try:
            return json.loads(cls.path.read_text())
        except FileNotFoundError:
            return {}

    @classmethod
    def save(cls, **values) -> dict:
        data = {**cls.load(), **values}
        cls.path.parent.mkdir(parents=True, exist_ok=True)
        cls.path.write_text(json.dumps(data))
        return data


def docker_usable() -> bool:
    try:
        found = subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return found.returncode == 0


def ensure_machine(backend: str) -> Machine:
    """The demo machine: a fresh container (docker) or a tmux socket of its own."""
    data = DemoState.load()
    machine = Machine.objects.filter(name=data.get("machine", "")).exclude(state=MachineState.DELETED).first()
    if machine is not None:
        return machine
    suffix = f"{int(time.time())}"
    name = f"{PREFIX}-{suffix}"
    if backend == "docker":
        started = subprocess.run(
            [
                "docker",
                "run",
                "-d",
                "--network",
                "none",
                "--label",
                "tether.demo=1",
                "--name",
                name,
                IMAGE,
                "sleep",
                "inf",
            ],
            capture_output=True,
            text=True,
        )
        if started.returncode != 0:
            raise DemoFailed(f"could not start a demo container from {IMAGE}: {started.stderr.strip()}")
        ref, counter = name, "/tmp/tether-demo-launches"
    else:
        ref, counter = name, str(Path(settings.DATA_DIR) / f"{name}-launches")
    machine = exec_actions.add_machine(name=name, backend=backend, ref=ref, scope="demo", actor=ACTOR)
    DemoState.save(machine=name, backend=backend, counter=counter)
    say(f"machine {name}: {backend} ({ref})")
    return machine


def demo_user():
    user, _ = get_user_model().objects.get_or_create(username="tether-demo", defaults={"is_staff": True})
    return user


def launches(machine: Machine) -> int:
    counter = DemoState.load()["counter"]
    if machine.backend == "docker":
        read = subprocess.run(["docker", "exec", machine.ref, "cat", counter], capture_output=True, text=True)
        text = read.stdout
    else:
        text = Path(counter).read_text() if Path(counter).exists() else ""
    return text.count("launched")


def counting_shell(machine: Machine) -> list[str]:
    """The shell, started through a line that appends to the launch counter: a relaunch would show."""
    counter = DemoState.load()["counter"]
    shell = "/bin/sh" if machine.backend == "docker" else "/bin/bash"
    return ["/bin/sh", "-c", f"echo launched >> {counter}; exec {shell} -i"]


# --- a viewer over the channel layer, as the consumer is ---------------------------------------


class LayerViewer:
    def __init__(self, session: TerminalSession):
        self.session = session
        self.layer = get_channel_layer()
        self.output = bytearray()
        self.seq = 0

    async def attach(self, timeout: float = 30.0) -> dict:
        self.reply = await self.layer.new_channel("demo.viewer.")
        deadline = time.monotonic() + timeout
        attach = 0
        while time.monotonic() < deadline:
            lease = await db(_lease_of)(self.session.pk)
            if lease:
                self.worker_channel, self.execution = lease
                attach += 1
                await self._send("session.attach", attach=attach, since=0, generation=None, cols=None, rows=None)
                answer = await self._receive_until({"terminal.attached", "terminal.error"}, 10)
                if answer["type"] == "terminal.attached":
                    return answer
            await asyncio.sleep(0.2)
        raise DemoFailed("no worker took the session")

    async def _send(self, kind: str, **fields) -> None:
        message = {"type": kind, "execution": self.execution, "viewer": "demo", "reply": self.reply, **fields}
        await self.layer.send(self.worker_channel, message)

    async def type(self, data: bytes | str) -> None:
        self.seq += 1
        await self._send("session.input", data=data.encode() if isinstance(data, str) else data, seq=self.seq)

    async def resize(self, cols: int, rows: int) -> None:
        await self._send("session.resize", cols=cols, rows=rows)

    async def _take(self, message: dict) -> dict:
        """Keep what a message carries: output is kept and acknowledged, as the page does."""
        if message["type"] == "terminal.output":
            self.output += message["data"]
            await self._send("session.ack", offset=message["offset"] + len(message["data"]))
        return message

    async def _receive_until(self, kinds: set[str], timeout: float) -> dict:
        async with asyncio.timeout(timeout):
            while True:
                message = await self._take(await self.layer.receive(self.reply))
                if message["type"] in kinds:
                    return message

    async def read_until(self, needle: bytes, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while needle not in self.output:
            remaining = deadline - time.monotonic()
            message = await self.next_message(remaining) if remaining > 0 else None
            if message is None:
                raise DemoFailed(f"{needle!r} never appeared; got {bytes(self.output[-300:])!r}")
            await self._take(message)

    async def next_message(self, timeout: float) -> dict | None:
        try:
            return await asyncio.wait_for(self.layer.receive(self.reply), timeout)
        except TimeoutError:
            return None

    async def detach(self) -> None:
        await self._send("session.detach")


def _lease_of(session_pk) -> tuple[str, int] | None:
    session = TerminalSession.objects.get(pk=session_pk)
    lease = (
        ProcessLease.objects.select_related("worker")
        .filter(execution_id=session.execution_id, released_at__isnull=True)
        .exclude(handle={})
        .first()
    )
    return (lease.worker.channel_name, lease.execution_id) if lease and lease.worker else None


async def wait_state(pk: int, states: set[str], timeout: float = 60.0) -> Execution:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        execution = await db(Execution.objects.select_related("machine").get)(pk=pk)
        if execution.state in states:
            return execution
        await asyncio.sleep(0.2)
    raise DemoFailed(f"execution {pk} never reached {'/'.join(sorted(states))}")


class InProcessWorker:
    """An owner worker in this process, for the phases that need one to hold the session."""

    def __init__(self, backend: str):
        self.worker = OwnerWorker(backends={backend}, poll_interval=0.2)
        self.stop = asyncio.Event()

    async def __aenter__(self) -> OwnerWorker:
        await self.worker.start()
        self.task = asyncio.create_task(self.worker.run(self.stop))
        return self.worker

    async def __aexit__(self, *exc) -> None:
        self.stop.set()
        await self.task


@contextlib.asynccontextmanager
async def attached_shell(backend: str):
    """The demo machine's shell, held by a worker in this process, with a viewer attached to it."""
    machine = await db(ensure_machine)(backend)
    async with InProcessWorker(machine.backend):
        session, _ = await db(actions.open_terminal)(machine, await db(demo_user)())
        viewer = LayerViewer(session)
        await viewer.attach()
        yield machine, session, viewer


# --- the phases ---------------------------------------------------------------------------------


async def run(backend: str) -> None:
    say("run: a shell writes a file, is resized and exits 7; the exit is known, the slot freed, the file read back")
    async with attached_shell(backend) as (machine, session, viewer):
        await viewer.type("echo tether-demo > /tmp/tether-demo-file; echo wrote-$((40+2))\r")
        await viewer.read_until(b"wrote-42")
        prove(True, "the shell ran the command (wrote-42 echoed back)")
        await viewer.resize(100, 30)
        await viewer.type("stty size\r")
        await viewer.read_until(b"30 100")
        prove(True, "the terminal was resized to 100x30 (stty size says 30 100)")
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
            execution_id=f"read-back-{int(time.time())}",
            machine_name=machine.name,
            spec=await db(ExecutionSpec.build)(["cat", "/tmp/tether-demo-file"]),
            actor=ACTOR,
        )
        read = await wait_state(read.pk, {State.COMPLETED, State.UNKNOWN})
        output = bytes(read.output).replace(b"\r\n", b"\n")
        prove(
            read.exit_code == 0 and output == b"tether-demo\n",
            "a separate command read the file back",
            repr(output),
        )
    await db(delete)()


def delete() -> None:
    """Delete the demo machine (its slot must be free) and prove it is gone."""
    data = DemoState.load()
    machine = Machine.objects.filter(name=data.get("machine", "")).first()
    if machine is None:
        say("delete: no demo machine")
        return
    say(f"delete: machine {machine.name}")
    for session in TerminalSession.objects.filter(machine=machine).exclude(process_state="closed"):
        raise DemoFailed(f"session {session.id} is still open: close it (or run recover) first")
    machine = exec_actions.set_machine_state(machine, MachineState.DELETED, actor=ACTOR, reason="demo done")
    prove(machine.state == MachineState.DELETED, "the machine is marked deleted, with its event")
    if machine.backend == "docker":
        subprocess.run(["docker", "rm", "-f", machine.ref], capture_output=True)
        gone = subprocess.run(["docker", "inspect", machine.ref], capture_output=True).returncode != 0
        prove(gone, f"container {machine.ref} no longer exists")
    else:
        subprocess.run(["tmux", "-L", machine.ref, "kill-server"], capture_output=True)
    DemoState.path.unlink(missing_ok=True)


async def shell(backend: str) -> None:
    say("shell: type lines; :resize COLS ROWS, :interrupt (Ctrl-C), :eof (Ctrl-D), :close (detach; the shell stays)")
    async with attached_shell(backend) as (_machine, _session, viewer):
        printed = 0
        lines = asyncio.Queue()
        loop = asyncio.get_running_loop()
        loop.add_reader(sys.stdin.fileno(), lambda: lines.put_nowait(sys.stdin.readline()))
        try:
            while True:
                message = await viewer.next_message(0.05)
                if message:
                    await viewer._take(message)
                if message and message["type"] in ("terminal.exit", "terminal.closed"):
                    say(f"\n[{message.get('outcome') or message.get('text') or message['type']}]")
                    return
                if len(viewer.output) > printed:
                    sys.stdout.buffer.write(bytes(viewer.output[printed:]))
                    sys.stdout.flush()
                    printed = len(viewer.output)
                while not lines.empty():
                    line = lines.get_nowait()
                    if line == "" or line.strip() == ":close":
                        await viewer.detach()
                        say("\n[detached; this demo's worker stops: a tmux shell stays for the next worker to adopt]")
                        return
                    command, *args = line.split()
                    if command == ":resize" and len(args) == 2:
                        await viewer.resize(int(args[0]), int(args[1]))
                    elif command == ":interrupt":
                        await viewer.type(b"\x03")
                    elif command == ":eof":
                        await viewer.type(b"\x04")
                    else:
                        await viewer.type(line.rstrip("\n") + "\r")
        finally:
            loop.remove_reader(sys.stdin.fileno())


def _worker_env() -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1"}


async def interrupt(backend: str) -> None:
    say("interrupt: a worker holds a shell; it is killed (SIGKILL) mid-session")
    machine = await db(ensure_machine)(backend)
    log = open(Path(settings.DATA_DIR) / "terminal-demo-worker.log", "ab")
    worker = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "terminal_worker", "--backends", machine.backend, "--poll", "0.2"],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=_worker_env(),
        start_new_session=True,
    )
    session, _ = await db(actions.open_terminal)(
        machine, await db(demo_user)(), shell=await db(counting_shell)(machine)
    )
    execution = await wait_state(session.execution_id, {State.RUNNING, State.COMPLETED, State.UNKNOWN})
    prove(execution.state == State.RUNNING, f"worker pid {worker.pid} runs the shell", execution.outcome_label)
    deadline = time.monotonic() + 15
    while await db(launches)(machine) < 1 and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    prove(await db(launches)(machine) == 1, "the shell was launched once")
    os.kill(worker.pid, signal.SIGKILL)
    worker.wait()
    DemoState.save(session=str(session.id), execution=session.execution_id, worker_pid=worker.pid)
    prove(True, f"worker pid {worker.pid} was killed with SIGKILL: the session has no owner now")
    say("next: manage.py terminal_demo recover")


async def recover(backend: str) -> None:
    data = DemoState.load()
    if not data.get("execution"):
        raise DemoFailed("nothing to recover: run terminal_demo interrupt first")
    say("recover: a new worker starts, finds the dead owner's lease once it expires, and settles it")
    machine = await db(Machine.objects.get)(name=data["machine"])
    async with InProcessWorker(machine.backend) as worker:
        deadline = time.monotonic() + settings.TETHER_LEASE_TTL_SECONDS + 30
        while time.monotonic() < deadline:
            for line in await worker.recover_once():
                say(f"  recovery: {line}")
            execution = await db(Execution.objects.get)(pk=data["execution"])
            adopted = await db(_adopted)(execution.pk)
            if adopted or execution.state != State.RUNNING:
                break
            await asyncio.sleep(1)
        execution = await db(Execution.objects.select_related("machine").get)(pk=data["execution"])
        if await db(_adopted)(execution.pk):
            prove(execution.state == State.RUNNING, "the shell was adopted: still running, with an adopted event")
            session = await db(TerminalSession.objects.get)(pk=data["session"])
            viewer = LayerViewer(session)
            await viewer.attach()
            await viewer.type("echo still-here-$((6*7))\r")
            await viewer.read_until(b"still-here-42")
            prove(True, "a viewer reattached to the same shell and typed into it")
            await viewer.type("exit 0\r")
            execution = await wait_state(execution.pk, {State.COMPLETED, State.UNKNOWN})
            prove(execution.exit_code == 0, "its exit was observed by the new owner", execution.outcome_label)
        else:
            prove(
                execution.state == State.UNKNOWN, "nothing could observe it: the outcome is unknown", execution.evidence
            )
            machine = await db(Machine.objects.get)(pk=machine.pk)
            prove(machine.active_execution_id == execution.pk, "the slot stays held until an operator resolves it")
            resolved, checks = await db(resolve)(
                execution, actor=ACTOR, note="demo: worker killed; recovery ended the unobservable shell"
            )
            for check in checks:
                say(f"    {check}")
            prove(resolved.state == State.RESOLVED, "resolved after Tether's own checks", resolved.outcome_label)
            machine = await db(Machine.objects.get)(pk=machine.pk)
            prove(machine.active_execution_id is None, "the slot is free again")
    count = await db(launches)(machine)
    prove(count == 1, "the shell was launched exactly once", f"launch counter: {count}")
    DemoState.save(execution=None, session=None)


def _adopted(execution_pk: int) -> bool:
    from executions.models import Evidence, ExecutionEvent

    return ExecutionEvent.objects.filter(execution_id=execution_pk, evidence=Evidence.ADOPTED).exists()
