"""The demo's world: its machine and user, its state file between phases, the facts it reads back, and a
worker and viewer it can hold a session with (demo.phases runs the phases over these)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import subprocess
import time
from pathlib import Path

from channels.db import database_sync_to_async as db
from django.conf import settings
from django.contrib.auth import get_user_model

from access import actions as access_actions
from access.models import Role
from demo.console import LayerViewer, ViewerLost
from executions import actions as exec_actions
from executions.actions import Actor
from executions.errors import Refused
from executions.models import Evidence, Execution, ExecutionEvent, Machine, MachineState
from terminals import actions
from terminals.models import ProcessLease, TerminalSession, Worker
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
    name = f"{PREFIX}-{secrets.token_hex(4)}"  # this run's own: concurrent runs share no container or file
    if backend == "docker":
        options = ["--network", "none", "--label", LABEL, "--name", name]
        started = subprocess.run(
            ["docker", "run", "-d", *options, IMAGE, "sleep", "inf"], capture_output=True, text=True
        )
        if started.returncode != 0:
            raise DemoFailed(f"could not start a demo container from {IMAGE}: {started.stderr.strip()}")
        ref, counter = name, "/tmp/tether-demo-launches"
    else:
        ref, counter = name, str(Path(settings.DATA_DIR) / f"{name}-launches")
    machine = exec_actions.add_machine(name=name, backend=backend, ref=ref, scope="demo", actor=ACTOR)
    # The demo's user operates its own machine, through a grant like anyone else's (docs/access.md).
    access_actions.grant(role=Role.OPERATE, actor=ACTOR, user=demo_user(), machine=machine, note="the demo's machine")
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


# --- who holds what ------------------------------------------------------------------------------


def slot_holder(machine_pk: int) -> Execution | None:
    """The execution holding the demo machine's command slot, if any."""
    machine = Machine.objects.select_related("active_execution__machine").get(pk=machine_pk)
    return machine.active_execution


def owner_of(execution_pk: int) -> Worker | None:
    """The worker whose unreleased lease holds the execution's process."""
    lease = ProcessLease.objects.select_related("worker").filter(execution_id=execution_pk, released_at__isnull=True)
    found = lease.first()
    return found.worker if found else None


def open_session(machine_pk: int) -> TerminalSession | None:
    return (
        TerminalSession.objects.select_related("machine", "execution")
        .filter(machine_id=machine_pk)
        .exclude(process_state="closed")
        .first()
    )


def adopted(execution_pk: int) -> bool:
    return ExecutionEvent.objects.filter(execution_id=execution_pk, evidence=Evidence.ADOPTED).exists()


def demo_machine() -> Machine | None:
    name = DemoState.load().get("machine", "")
    return Machine.objects.filter(name=name).exclude(state=MachineState.DELETED).first()


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
    """The demo machine's shell, held by a worker in this process, with a viewer attached to it. A shell
    left by an earlier phase is adopted (tmux) by this worker first; a slot held by an unknown outcome is
    refused with the phase that settles it."""
    machine = await db(ensure_machine)(backend)
    async with InProcessWorker(machine.backend):
        try:
            session, _ = await db(actions.open_terminal)(machine, await db(demo_user)())
        except Refused as refused:
            raise DemoFailed(f"{refused} (terminal_demo recover settles it)") from None
        viewer = LayerViewer(session)
        try:
            await viewer.attach()
        except ViewerLost as lost:
            owner = await db(owner_of)(session.execution_id)
            held = f"; worker pid {owner.pid} on {owner.host} holds it" if owner else ""
            raise DemoFailed(f"{lost}{held}") from None
        yield machine, session, viewer


def demo_file(machine: Machine) -> str:
    """Where the run phase writes: inside the demo's own container, else a path of this run's machine."""
    return "/tmp/tether-demo-file" if machine.backend == "docker" else f"/tmp/{machine.name}-file"
