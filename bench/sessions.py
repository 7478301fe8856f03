"""What the benchmarks share: their context, sessions opened and closed through Tether, and echo timing."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from asgiref.sync import sync_to_async

from bench.common import RawPty, Report, wait_until

MIB = 1024 * 1024


@dataclass
class Context:
    stack: object  # tests.bridge.harness.Stack
    user: object
    cookie: str
    report: Report
    quick: bool
    workdir: Path
    peers: dict = field(default_factory=dict)  # the peers' figures measured in this run (terminado's echo)
    sizes: dict = field(default_factory=dict)  # --size NAME=N: a benchmark's size instead of quick or full


async def terminado_echo_summary(ctx: Context, samples: int) -> dict[str, float]:
    """terminado's keystroke echo on the same program, measured once a run (echo and embedded share it)."""
    from bench.common import summary
    from bench.terminado_peer import terminado_echo

    if "echo" not in ctx.peers:
        ctx.peers["echo_cpu"] = {}
        ctx.peers["echo"] = summary(await terminado_echo(RAW_CAT, samples, ctx.peers["echo_cpu"]))
    return ctx.peers["echo"]


def machine_for(backend: str, ref: str = ""):
    from executions.actions import Actor, add_machine

    # Twelve hex digits, not unique()'s six: 5,000 names in six digits collide about every other run.
    name = f"bench-{backend}-{uuid.uuid4().hex[:12]}"
    return add_machine(name=name, backend=backend, ref=ref, scope="bench", actor=Actor.command("bench"))


def terminal_for(machine, user, shell: list[str]):
    from terminals.actions import open_terminal

    return open_terminal(machine, user, shell=shell)[0]


async def open_session(ctx: Context, shell: list[str], backend: str = "local", ref: str = "", port: int | None = None):
    from tests.bridge.harness import Viewer

    machine = await sync_to_async(machine_for)(backend, ref)
    session = await sync_to_async(terminal_for)(machine, ctx.user, shell)
    viewer = await Viewer.open(port or ctx.stack.ports[0], session.id, ctx.cookie)
    await viewer.attach()
    return viewer, session


async def ask_to_close(session) -> None:
    """An operator's Kill for ``session`` (carried out by its worker; not waited for)."""
    from executions.actions import Actor
    from terminals.actions import operator_session_action
    from terminals.models import TerminalSession

    def kill() -> None:
        fresh = TerminalSession.objects.get(pk=session.pk)
        if fresh.process_state != "closed":
            operator_session_action(fresh, "kill", actor=Actor.command("bench"))

    await sync_to_async(kill)()


async def close_session(session) -> None:
    """Kill ``session`` and wait until its worker has carried it out: a run that stopped its worker first
    left the held shell running (a holder outlives its worker by design), one per benchmark."""
    await close_all([session])


async def frame(viewer, timeout: float = 10.0) -> bytes:
    """The next binary frame (control messages are kept on the viewer)."""
    while True:
        before = len(viewer.output)
        await viewer._next(timeout)
        if len(viewer.output) > before:
            return bytes(viewer.output[before:])


def worker_pid(ctx: Context) -> int:
    return ctx.stack.workers[-1].pid


def daphne_pid(ctx: Context) -> int:
    return ctx.stack.daphnes[0].pid


async def echo_latency(viewer, samples: int) -> list[float]:
    """Send one byte at a time and time until it comes back (the program echoes it: cat in raw mode)."""
    times = []
    letters = b"abcdefghijklmnopqrstuvwxyz"
    for i in range(samples):
        byte = letters[i % 26 : i % 26 + 1]
        began = time.perf_counter()
        await viewer.type(byte)
        while byte not in await frame(viewer):
            pass
        times.append((time.perf_counter() - began) * 1000)
    return times


RAW_CAT = ["/bin/sh", "-c", "stty raw -echo; echo READY; exec cat"]


def raw_echo_latency(samples: int) -> list[float]:
    raw = RawPty(RAW_CAT)
    try:
        buffered = b""
        while b"READY" not in buffered:
            buffered += raw.read()
        times = []
        letters = b"abcdefghijklmnopqrstuvwxyz"
        for i in range(samples):
            byte = letters[i % 26 : i % 26 + 1]
            began = time.perf_counter()
            raw.write(byte)
            while byte not in raw.read():
                pass
            times.append((time.perf_counter() - began) * 1000)
        return times
    finally:
        raw.close()


async def close_all(sessions) -> float:
    """Kill every session and wait until all are closed; returns how long asking took (seconds)."""
    from terminals.models import TerminalSession

    began = time.monotonic()
    for session in sessions:
        await ask_to_close(session)
    asking = time.monotonic() - began
    await wait_until(
        lambda: sync_to_async(
            lambda: (
                not TerminalSession.objects.filter(pk__in=[s.pk for s in sessions])
                .exclude(process_state="closed")
                .exists()
            )
        )(),
        timeout=900,
        interval=0.5,
    )
    return asking
