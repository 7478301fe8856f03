"""What recording every shell costs (docs/recordings.md), against the same shell unrecorded, in the same run:
output through Tether, a command's round trip, and the recording's size at rest per MB of output.

The unrecorded shells run on a second worker started with TETHER_RECORDINGS=0 under a host name of its own,
so that only it claims them (machines run on their host's workers); the rest of the path is the same stack.
"""

from __future__ import annotations

from asgiref.sync import sync_to_async

from bench.commands import SHELL, _rate, _round_trip
from bench.common import Figure, unique, wait_until
from bench.sessions import MIB, Context, close_session
from bench.throughput import make_data

ROUNDS = 3  # recorded and unrecorded alternate, each's best kept


def _machine(host: str | None):
    from executions.actions import Actor, add_machine

    actor = Actor.command("bench")
    return add_machine(name=unique("bench-rec"), backend="local", scope="bench", actor=actor, host=host)


async def _open(ctx: Context, host: str | None):
    from bench.sessions import terminal_for
    from tests.bridge.harness import Viewer

    machine = await sync_to_async(_machine)(host)
    session = await sync_to_async(terminal_for)(machine, ctx.user, SHELL)
    viewer = await Viewer.open(ctx.stack.ports[0], session.id, ctx.cookie)
    await viewer.attach()
    await viewer.type("stty -echo; echo re''ady\r")
    await viewer.read_until(b"ready", timeout=30)
    return viewer, session


def _saved(session):
    from terminals.models import Recording

    return Recording.objects.filter(session=session, state="saved").first()


async def bench_recordings(ctx: Context) -> None:
    size = (50 if ctx.quick else 200) * MIB
    data = ctx.workdir / f"bench-{size // MIB}MB.b64"
    make_data(data, size)
    count = 100 if ctx.quick else 500
    elsewhere = unique("bench-unrecorded-host")
    worker = await sync_to_async(ctx.stack.start_worker)("local", {"TETHER_RECORDINGS": "0", "TETHER_HOST": elsewhere})
    opened = {"unrecorded": await _open(ctx, elsewhere), "recorded": await _open(ctx, None)}
    try:
        rates: dict[str, list[float]] = {"unrecorded": [], "recorded": []}
        trips: dict[str, list[float]] = {"unrecorded": [], "recorded": []}
        for _ in range(ROUNDS):
            for kind, (viewer, _) in opened.items():
                rates[kind].append(await _rate(viewer, str(data)))
                trips[kind].append(await _round_trip(viewer, count))
    finally:
        for viewer, session in opened.values():
            await viewer.close()
            await close_session(session)
        worker.terminate()
        await sync_to_async(worker.wait)()
    ctx.report.add(
        Figure(
            f"recordings: output of a recorded shell ({size // MIB} MB base64 through Tether)",
            max(rates["recorded"]),
            "MB/s",
            max(rates["unrecorded"]),
            "the same shell unrecorded",
            note=f"best of {ROUNDS} each, alternating",
        )
    )
    ctx.report.add(
        Figure(
            f"recordings: a command's round trip, recorded (Enter to its output, {count} commands)",
            min(trips["recorded"]),
            "ms",
            min(trips["unrecorded"]),
            "the same shell unrecorded",
            note="best of each",
        )
    )
    recording = await wait_until(sync_to_async(lambda: _saved(opened["recorded"][1])), timeout=120, interval=0.5)
    ctx.report.add(
        Figure(
            "recordings: size at rest (gzip-compressed .cast) per MB of output",
            recording.file_bytes / max(recording.output_bytes, 1) * MIB / 1024,
            "KiB/MB",
            note=f"{recording.output_bytes / MIB:.0f} MB of base64 output, mostly incompressible",
        )
    )
