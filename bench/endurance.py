"""A stalled reader, reconnects after time away, and recovery after a worker is killed."""

from __future__ import annotations

import asyncio
import signal
import time

from asgiref.sync import sync_to_async

from bench.common import Figure, redis_rss_kib, rss_kib, summary, unique, wait_until
from bench.sessions import (
    Context,
    close_session,
    daphne_pid,
    frame,
    machine_for,
    open_session,
    terminal_for,
    worker_pid,
)


async def bench_stalled(ctx: Context) -> None:
    from django.conf import settings

    seconds = 15 if ctx.quick else 60
    viewer, session = await open_session(ctx, ["/bin/bash", "--noprofile", "--norc", "-i"])
    await viewer.type("PS1='prompt$ '\r")
    await viewer.read_until(b"prompt$ ")
    # Baseline: Ctrl-C under the same `yes` while the viewer keeps up.
    await viewer.type("yes\r")
    await viewer.read_for(1)
    began = time.perf_counter()
    await viewer.type(b"\x03")
    await viewer.read_until(b"prompt$ ", timeout=30)
    ctrl_c_keeping_up = (time.perf_counter() - began) * 1000
    worker, daphne = worker_pid(ctx), daphne_pid(ctx)
    before = (rss_kib(worker), rss_kib(daphne), redis_rss_kib(ctx.stack.redis_url))
    viewer.auto_ack = False
    await viewer.type("yes\r")
    await viewer.read_for(seconds)
    in_flight = viewer.offset - viewer.acked
    after = (rss_kib(worker), rss_kib(daphne), redis_rss_kib(ctx.stack.redis_url))
    viewer.auto_ack = True
    await viewer.ack()
    began = time.perf_counter()
    await viewer.type(b"\x03")
    await viewer.read_until(b"prompt$ ", timeout=30)
    ctrl_c = (time.perf_counter() - began) * 1000
    ctx.report.add(
        Figure(
            f"stalled {seconds} s: bytes in flight",
            in_flight / 1024,
            "KiB",
            settings.TETHER_FLOW_HIGH_BYTES / 1024,
            "the flow window",
            goal="≤ 512 KiB",
            met=in_flight <= 512 * 1024,
        )
    )
    for name, first, last in zip(("worker", "daphne", "redis"), before, after, strict=True):
        growth = (last - first) / 1024
        ctx.report.add(
            Figure(
                f"stalled {seconds} s: {name} RSS growth",
                growth,
                "MiB",
                first / 1024,
                "its RSS before",
                goal="< 10 MiB",
                met=growth < 10,
            )
        )
    ctx.report.add(
        Figure(
            "stalled: Ctrl-C to prompt after resuming",
            ctrl_c,
            "ms",
            ctrl_c_keeping_up,
            "Ctrl-C while the viewer keeps up",
            goal="≤ 300 ms",
            met=ctrl_c <= 300,
        )
    )
    await viewer.close()
    await close_session(session)


async def bench_reconnect(ctx: Context) -> None:
    from tests.bridge.harness import Viewer

    trials = 10 if ctx.quick else 20
    for pause in (1, 5 if ctx.quick else 30):
        count = trials if pause == 1 else 3
        times, first_bytes, gaps = [], [], 0
        warm = 1 if pause == 1 else 0  # a fresh stack's first reconnect takes ~100 ms, once: not timed
        for trial in range(count + warm):
            viewer, session = await open_session(
                ctx, ["/bin/sh", "-c", "stty -echo; read x; seq 1 300000; echo __END__; exec cat"]
            )
            await asyncio.sleep(0.2)
            began = time.perf_counter()
            await viewer.type(b"\r")
            await frame(viewer)  # the baseline: from a keystroke to the first byte it makes the shell print
            first_bytes.append((time.perf_counter() - began) * 1000)
            while len(viewer.output) < 200_000:
                await viewer._next(10)
            received, epoch = bytes(viewer.output), viewer.messages[-1].get("epoch")
            attached = next(m for m in reversed(viewer.messages) if m["type"] == "attached")
            offset = attached["offset"] + len(received)
            await viewer.ws.close()
            await asyncio.sleep(pause)
            again = await Viewer.open(ctx.stack.ports[0], session.id, ctx.cookie)
            began = time.perf_counter()
            reply = await again.attach(
                since=offset, generation=attached["generation"], epoch=attached.get("epoch", epoch)
            )
            await frame(again)
            if trial >= warm:
                times.append((time.perf_counter() - began) * 1000)
            while b"__END__" not in again.output[-4096:]:
                await again._next(30)
            text = (received + bytes(again.output)).split(b"__END__")[0].decode()
            numbers = [int(n) for n in text.split() if n.isdigit()]
            if reply["lost"] or numbers != list(range(1, 300001)):
                gaps += 1
            await again.close()
            await close_session(session)
        stats = summary(times)
        ctx.report.add(
            Figure(
                f"reconnect after {pause} s away: to first replayed byte, p95 ({count} trials)",
                stats["p95"],
                "ms",
                summary(first_bytes)["p95"],
                "keystroke to first live byte, p95",
                goal="≤ 50 ms, 0 gaps",
                met=stats["p95"] <= 50 and gaps == 0,
                note=f"{gaps} with a gap or duplicate",
            )
        )


async def bench_recovery(ctx: Context) -> None:
    from django.conf import settings

    await kill_to_adopted(
        ctx, "tmux", unique("tether-bench"), "marker", "tmux",
        note=f"periodic recovery pass every {settings.TETHER_RECOVERY_SECONDS} s",
    )  # fmt: skip


async def kill_to_adopted(ctx: Context, backend: str, ref: str, held_key: str, label: str, note: str = "") -> None:
    """kill -9 of the worker holding a shell on ``backend`` (once its lease's handle has ``held_key``), to
    the shell adopted by the next worker."""
    from executions.models import Evidence, ExecutionEvent
    from terminals.models import ProcessLease

    machine = await sync_to_async(machine_for)(backend, ref)
    session = await sync_to_async(terminal_for)(machine, ctx.user, ["/bin/sh", "-c", "exec cat"])
    await wait_until(
        lambda: sync_to_async(
            ProcessLease.objects.filter(execution_id=session.execution_id, handle__has_key=held_key).exists
        )()
    )
    victim = ctx.stack.workers[-1]
    victim.send_signal(signal.SIGKILL)
    killed = time.perf_counter()
    victim.wait()
    await sync_to_async(ctx.stack.start_worker)("local,tmux,docker")

    async def adopted():
        return await sync_to_async(
            ExecutionEvent.objects.filter(execution_id=session.execution_id, evidence=Evidence.ADOPTED).exists
        )()

    await wait_until(adopted, timeout=120)
    elapsed = time.perf_counter() - killed
    ttl = int(ctx.stack.env()["TETHER_LEASE_TTL_SECONDS"])
    ctx.report.add(
        Figure(
            f"recovery: kill -9 to adopted ({label})",
            elapsed,
            "s",
            ttl,
            "lease TTL",
            goal=f"≤ TTL + 1 s = {ttl + 1} s",
            met=elapsed <= ttl + 1,
            note=f"TTL {ttl} s; {note}" if note else "",
        )
    )
    await close_session(session)
