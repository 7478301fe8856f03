"""What keeping typed commands on the record costs (docs/commands.md), each figure against the same shell
without the integration, in the same run: output through Tether from a tracked bash against an untracked
one, and a command's round trip (Enter to the next prompt) with its marks read and its record written.

``open_on``, ``alternate`` and ``report_pair`` serve any such A/B of one shell setting (bench/recordings.py)."""

from __future__ import annotations

import time

from asgiref.sync import sync_to_async

from bench.common import Figure
from bench.sessions import MIB, Context, close_session
from bench.throughput import make_data

ROUNDS = 3  # the two kinds alternate, each's best kept
SHELL = ["/bin/bash", "--noprofile", "--norc"]


def _machine(tracked: bool):
    from bench.common import unique
    from executions.actions import Actor, add_machine

    return add_machine(
        name=unique("bench-marks"), backend="local", scope="bench", actor=Actor.command("bench"), track_commands=tracked
    )


async def open_on(ctx: Context, machine):
    """A bash on ``machine``, echo off, ready for commands."""
    from bench.sessions import terminal_for
    from tests.bridge.harness import Viewer

    session = await sync_to_async(terminal_for)(machine, ctx.user, SHELL)
    viewer = await Viewer.open(ctx.stack.ports[0], session.id, ctx.cookie)
    await viewer.attach()
    await viewer.type("stty -echo; echo re''ady\r")
    await viewer.read_until(b"ready", timeout=30)
    return viewer, session


async def _rate(viewer, path: str) -> float:
    start = len(viewer.output)
    began = time.perf_counter()
    await viewer.type(f"cat {path}; echo __E''ND__\r")
    # The tail of what came since only: scanning all of it each time would be what is measured.
    while b"__END__" not in viewer.output[max(start, len(viewer.output) - 4096) :]:
        await viewer._next(30)
    return (len(viewer.output) - start) / (time.perf_counter() - began) / MIB


async def _round_trip(viewer, count: int) -> float:
    """Milliseconds per command: ``count`` echo lines, each typed once the last one's output is in."""
    began = time.perf_counter()
    for n in range(count):
        await viewer.type(f"echo r{n}-$((1+1))\r")
        await viewer.read_until(f"r{n}-2".encode(), timeout=30)
    return (time.perf_counter() - began) * 1000 / count


async def alternate(ctx: Context, opened: dict) -> tuple[dict, dict, int, int]:
    """Output rate (MB/s) and command round trip (ms) of each kind's shell (``opened``: kind -> (viewer, session)),
    the kinds alternating ROUNDS times. Returns (rates, trips, bytes of output, commands)."""
    size = (50 if ctx.quick else 200) * MIB
    data = ctx.workdir / f"bench-{size // MIB}MB.b64"
    make_data(data, size)
    count = 100 if ctx.quick else 500
    rates: dict[str, list[float]] = {kind: [] for kind in opened}
    trips: dict[str, list[float]] = {kind: [] for kind in opened}
    for _ in range(ROUNDS):
        for kind, (viewer, _) in opened.items():
            rates[kind].append(await _rate(viewer, str(data)))
            trips[kind].append(await _round_trip(viewer, count))
    return rates, trips, size, count


async def close_pair(ctx: Context, opened: dict, *workers) -> None:
    """The shells of an A/B closed, and the workers it started for its kinds stopped."""
    for viewer, session in opened.values():
        await viewer.close()
        await close_session(session)
    for worker in workers:
        worker.terminate()
        await sync_to_async(worker.wait)()
        ctx.stack.workers.remove(worker)  # the benchmarks after this one read the stack's worker (workers[-1])


def report_pair(ctx: Context, topic: str, kinds: tuple[str, str], measured: tuple[dict, dict, int, int]) -> None:
    """The two figures of an A/B: ``kinds`` is (measured, baseline)."""
    rates, trips, size, count = measured
    kind, baseline = kinds
    ctx.report.add(
        Figure(
            f"{topic}: output of a {kind} shell ({size // MIB} MB base64 through Tether)",
            max(rates[kind]),
            "MB/s",
            max(rates[baseline]),
            f"the same shell {baseline}",
            note=f"best of {ROUNDS} each, alternating",
        )
    )
    ctx.report.add(
        Figure(
            f"{topic}: a command's round trip, {kind} (Enter to its output, {count} commands)",
            min(trips[kind]),
            "ms",
            min(trips[baseline]),
            f"the same shell {baseline}",
            note="best of each",
        )
    )


async def bench_commands(ctx: Context) -> None:
    opened = {}
    for kind in ("untracked", "tracked"):
        opened[kind] = await open_on(ctx, await sync_to_async(_machine)(kind == "tracked"))
    try:
        measured = await alternate(ctx, opened)
    finally:
        for viewer, session in opened.values():
            await viewer.close()
            await close_session(session)
    report_pair(ctx, "commands", ("tracked", "untracked"), measured)
