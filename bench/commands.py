"""What keeping typed commands on the record costs (docs/commands.md), each figure against the same shell
without the integration, in the same run: output through Tether from a tracked bash against an untracked
one, and a command's round trip (Enter to the next prompt) with its marks read and its record written."""

from __future__ import annotations

import time

from asgiref.sync import sync_to_async

from bench.common import Figure
from bench.sessions import MIB, Context, close_session
from bench.throughput import make_data

ROUNDS = 3  # tracked and untracked alternate, each's best kept
SHELL = ["/bin/bash", "--noprofile", "--norc"]


def _machine(tracked: bool):
    from bench.common import unique
    from executions.actions import Actor, add_machine

    return add_machine(
        name=unique("bench-marks"), backend="local", scope="bench", actor=Actor.command("bench"), track_commands=tracked
    )


async def _open(ctx: Context, tracked: bool):
    from bench.sessions import terminal_for
    from tests.bridge.harness import Viewer

    machine = await sync_to_async(_machine)(tracked)
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


async def bench_commands(ctx: Context) -> None:
    size = (50 if ctx.quick else 200) * MIB
    data = ctx.workdir / f"bench-{size // MIB}MB.b64"
    make_data(data, size)
    count = 100 if ctx.quick else 500
    opened = {kind: await _open(ctx, kind == "tracked") for kind in ("untracked", "tracked")}
    try:
        rates: dict[str, list[float]] = {"untracked": [], "tracked": []}
        trips: dict[str, list[float]] = {"untracked": [], "tracked": []}
        for _ in range(ROUNDS):
            for kind, (viewer, _) in opened.items():
                rates[kind].append(await _rate(viewer, str(data)))
                trips[kind].append(await _round_trip(viewer, count))
    finally:
        for viewer, session in opened.values():
            await viewer.close()
            await close_session(session)
    ctx.report.add(
        Figure(
            f"commands: output of a tracked bash ({size // MIB} MB base64 through Tether)",
            max(rates["tracked"]),
            "MB/s",
            max(rates["untracked"]),
            "the same bash untracked",
            note=f"best of {ROUNDS} each, alternating",
        )
    )
    ctx.report.add(
        Figure(
            f"commands: a command's round trip, tracked (Enter to its output, {count} commands)",
            min(trips["tracked"]),
            "ms",
            min(trips["untracked"]),
            "the same bash untracked",
            note="its marks read, its record written and sent; best of each",
        )
    )
