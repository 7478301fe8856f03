"""What recording every shell costs (docs/recordings.md), against the same shell unrecorded, in the same run:
output through Tether, a command's round trip, and the recording's size at rest per MB of output.

The unrecorded shells run on a second worker started with TETHER_RECORDINGS=0 under a host name of its own,
so that only it claims them (machines run on their host's workers); the rest of the path is the same stack.
"""

from __future__ import annotations

from asgiref.sync import sync_to_async

from bench.commands import alternate, close_pair, open_on, report_pair
from bench.common import Figure, unique, wait_until
from bench.sessions import MIB, Context


def _machine(host: str | None):
    from executions.actions import Actor, add_machine

    actor = Actor.command("bench")
    return add_machine(name=unique("bench-rec"), backend="local", scope="bench", actor=actor, host=host)


def _saved(session):
    from recordings.models import Recording

    return Recording.objects.filter(session=session, state="saved").first()


async def bench_recordings(ctx: Context) -> None:
    elsewhere = unique("bench-unrecorded-host")
    worker = await sync_to_async(ctx.stack.start_worker)("local", {"TETHER_RECORDINGS": "0", "TETHER_HOST": elsewhere})
    opened = {}
    try:
        for kind, host in (("unrecorded", elsewhere), ("recorded", None)):
            opened[kind] = await open_on(ctx, await sync_to_async(_machine)(host))
        measured = await alternate(ctx, opened)
    finally:
        await close_pair(ctx, opened, worker)
    report_pair(ctx, "recordings", ("recorded", "unrecorded"), measured)
    recording = await wait_until(sync_to_async(lambda: _saved(opened["recorded"][1])), timeout=120, interval=0.5)
    ctx.report.add(
        Figure(
            "recordings: size at rest (gzip-compressed .cast) per MB of output",
            recording.file_bytes / max(recording.output_bytes, 1) * MIB / 1024,
            "KiB/MB",
            note=f"{recording.output_bytes / MIB:.0f} MB of base64 output, mostly incompressible",
        )
    )
