"""Keystroke to echo, idle and under other sessions' load, and the channel layer's own hop."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time

from asgiref.sync import sync_to_async

from bench.common import (
    ROOT,
    Figure,
    cpu_seconds,
    machine_busy,
    postgres_cpu,
    postgres_since,
    redis_commands,
    redis_pid,
    summary,
    unique,
)
from bench.sessions import (
    MIB,
    RAW_CAT,
    Context,
    close_all,
    close_session,
    daphne_pid,
    echo_latency,
    machine_for,
    open_session,
    raw_echo_latency,
    terminado_echo_summary,
    terminal_for,
    worker_pid,
)


@contextlib.asynccontextmanager
async def second_stack(ctx: Context, **env: str):
    """A second daphne and worker with ``env``, and a viewer on a raw-mode ``cat`` that only its worker took (the
    main worker is parked while the session is claimed), warmed up: (the stack, the viewer). Stopped after."""
    from tests.bridge.harness import Stack

    stack = Stack(worker_poll=0.5)
    stack.extra_env.update(TETHER_SESSIONS_PER_USER="100000", **env)
    try:
        await sync_to_async(stack.start_daphne)()
        await sync_to_async(stack.start_worker)("local")
        ctx.stack.workers[-1].send_signal(signal.SIGSTOP)
        try:
            viewer, session = await open_session(ctx, RAW_CAT, port=stack.ports[0])
        finally:
            ctx.stack.workers[-1].send_signal(signal.SIGCONT)
        await viewer.read_until(b"READY")
        await echo_latency(viewer, 50)
        yield stack, viewer
        await viewer.close()
        await close_session(session)
    finally:
        await sync_to_async(stack.stop)()


async def bench_echo_other_layer(ctx: Context) -> None:
    """The idle echo again through a second daphne and worker on another layer (channels-redis's pub/sub when
    the default is Tether's)."""
    from django.conf import settings as django_settings

    other = "channels-pubsub" if django_settings.TETHER_CHANNEL_LAYER == "pubsub" else "pubsub"
    samples = 1000 if ctx.quick else 5000
    async with second_stack(ctx, TETHER_CHANNEL_LAYER=other) as (_, viewer):
        stats = summary(await echo_latency(viewer, samples))
    core = next((f for f in ctx.report.figures if f.name.startswith("echo p50, idle")), None)
    ctx.report.add(
        Figure(
            f"echo p50, idle, {other} layer ({samples} samples, local)",
            stats["p50"],
            "ms",
            core.value if core else None,
            f"{django_settings.TETHER_CHANNEL_LAYER} layer (the default, above)",
            note=f"p99 {stats['p99']:.2f} ms",
        )
    )


async def bench_echo(ctx: Context) -> None:
    samples = 1000 if ctx.quick else 5000
    baseline = summary(raw_echo_latency(samples))
    peer = await terminado_echo_summary(ctx, samples)
    async with echoing(ctx) as viewer:
        await _idle_echo(ctx, viewer, samples, baseline, peer)


async def _idle_echo(ctx: Context, viewer, samples: int, baseline: dict, peer: dict) -> None:
    processes = {"daphne": daphne_pid(ctx), "worker": worker_pid(ctx), "Redis": redis_pid(ctx.stack.redis_url)}
    before = {name: cpu_seconds(pid) for name, pid in processes.items()}
    commands = redis_commands(ctx.stack.redis_url)
    idle = summary(await echo_latency(viewer, samples))
    commands = (redis_commands(ctx.stack.redis_url) - commands) / samples
    cpu = {name: (cpu_seconds(pid) - before[name]) * 1000 / samples for name, pid in processes.items()}
    for p, goal in (("p50", 1.3), ("p95", None), ("p99", 2)):  # issue 45's goals
        ctx.report.add(
            Figure(
                f"echo {p}, idle ({samples} samples, local)",
                idle[p],
                "ms",
                peer[p],
                "terminado",
                f"≤ {goal}x terminado" if goal else "",
                idle[p] <= goal * peer[p] if goal else None,
                note=f"raw PTY {baseline[p]:.3f} ms",
            )
        )
    # Where an echo's time goes: the CPU each process spends per keystroke, against terminado's one process.
    ctx.report.add(
        Figure(
            "CPU per keystroke echo, idle: daphne + worker + Redis ("
            + ", ".join(f"{name} {ms:.3f}" for name, ms in cpu.items())
            + " ms)",
            sum(cpu.values()),
            "ms",
            ctx.peers["echo_cpu"]["terminado"],
            "terminado's server",
            "≤ 1.3x terminado's server",
            sum(cpu.values()) <= 1.3 * ctx.peers["echo_cpu"]["terminado"],
        )
    )
    # Counted over the whole Redis: what is left beside the stream is this count's own two INFOs and the beats.
    ctx.report.add(
        Figure(
            "Redis commands per keystroke echo, idle",
            commands,
            "",
            goal="0 (≤ 0.01: the count's own INFO and the periodic beats)",
            met=commands <= 0.01,
        )
    )


@contextlib.asynccontextmanager
async def echoing(ctx: Context):
    """A viewer on a raw-mode ``cat`` through the full path, warmed up; its session closed after."""
    viewer, session = await open_session(ctx, RAW_CAT)
    try:
        await viewer.read_until(b"READY")
        await echo_latency(viewer, 50)  # warm up
        yield viewer
    finally:
        await viewer.close()
        await close_session(session)


async def bench_echo_loaded(ctx: Context) -> None:
    """Echo while other sessions each stream about 1 MB/s to their own viewers. The full run steps up to
    the issue's 100, so the point where their demand passes what this machine can move shows."""
    peer = await terminado_echo_summary(ctx, 1000 if ctx.quick else 5000)
    async with echoing(ctx) as viewer:
        for count in (10, 25) if ctx.quick else (10, 25, 50, 100):
            await _loaded_echo(ctx, viewer, count, 500 if ctx.quick else 1000, peer)


async def _loaded_echo(ctx: Context, viewer, count: int, samples: int, idle_peer: dict) -> None:
    from tests.bridge.harness import STREAM_1MBS

    stream = list(STREAM_1MBS)
    others = [
        await sync_to_async(terminal_for)(await sync_to_async(machine_for)("local"), ctx.user, stream)
        for _ in range(count)
    ]
    # Their browsers are elsewhere: a process of their own, not this client's event loop.
    drain = subprocess.Popen(
        [sys.executable, "-m", "bench.drain", str(ctx.stack.ports[0]), ctx.cookie, *(str(s.id) for s in others)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        await asyncio.to_thread(drain.stdout.readline)  # "ready"
        await asyncio.sleep(2)  # past the replay of what they printed before being viewed
        drain.send_signal(signal.SIGUSR1)
        mark = int(await asyncio.to_thread(drain.stdout.readline))
        processes = {
            "daphne": daphne_pid(ctx),
            "worker": worker_pid(ctx),
            "Redis": redis_pid(ctx.stack.redis_url),
            "the viewers' client": drain.pid,
            "this client": os.getpid(),
        }
        before, postgres, busy = {n: cpu_seconds(p) for n, p in processes.items()}, postgres_cpu(), machine_busy()
        began = time.monotonic()
        loaded = summary(await echo_latency(viewer, samples))
        elapsed = time.monotonic() - began
        # Where the machine's two cores went meanwhile (the programs' own output loops are the rest).
        machine = (machine_busy() - busy) / elapsed
        used = {n: (cpu_seconds(p) - before[n]) / elapsed for n, p in processes.items()}
        used["PostgreSQL"] = postgres_since(postgres) / elapsed
        used["the machine"] = machine
        drain.send_signal(signal.SIGTERM)
        delivered = int((await asyncio.to_thread(drain.communicate, timeout=60))[0].split()[-1]) - mark
    finally:
        drain.kill()
        await close_all(others)  # ended, not only asked to end: the next benchmark starts clean
    ctx.report.add(
        Figure(
            f"echo p99, {count} other sessions streaming ~1 MB/s each ({samples} samples)",
            loaded["p99"],
            "ms",
            idle_peer["p99"],
            "terminado, idle",
            "≤ 20 ms",
            loaded["p99"] <= 20,
            note=f"p50 {loaded['p50']:.2f} ms; the {count} sessions got {delivered / MIB / elapsed:.1f} MB/s in all; "
            + "cores used: "
            + ", ".join(f"{name} {share:.2f}" for name, share in used.items()),
        )
    )


async def bench_layers(ctx: Context) -> None:
    """One message there and back between two channels: Tether's pub/sub layer against channels-redis's
    pub/sub and core layers, with the CPU each takes per hop (sender and receiver are this process)."""
    from channels_redis.core import RedisChannelLayer
    from channels_redis.pubsub import RedisPubSubChannelLayer

    from transport.redis_layer import RedisPubSubLayer

    samples = 500 if ctx.quick else 2000
    results = {}
    for name, layer in (
        (
            "core",
            RedisChannelLayer(hosts=[{"address": ctx.stack.redis_url, "socket_timeout": 15}], prefix=unique("bench")),
        ),
        (
            "channels-pubsub",
            RedisPubSubChannelLayer(hosts=[{"address": ctx.stack.redis_url, "protocol": 2}], prefix=unique("bench")),
        ),
        ("pubsub", RedisPubSubLayer(hosts=[ctx.stack.redis_url], prefix=unique("bench"))),
    ):
        a, b = await layer.new_channel(), await layer.new_channel()
        times = []
        cpu = time.process_time()
        for _ in range(samples):
            began = time.perf_counter()
            await layer.send(b, {"type": "ping", "data": b"x"})
            await layer.receive(b)
            await layer.send(a, {"type": "pong"})
            await layer.receive(a)
            times.append((time.perf_counter() - began) * 1000 / 2)
        results[name] = summary(times)
        results[name]["cpu"] = (time.process_time() - cpu) * 1e6 / (2 * samples)
        if hasattr(layer, "flush"):
            await layer.flush()
    ctx.report.add(
        Figure(
            "channel layer one-way hop, core (BZPOPMIN), p50",
            results["core"]["p50"],
            "ms",
            results["pubsub"]["p50"],
            "pub/sub",
            note=f"p99 {results['core']['p99']:.2f} vs {results['pubsub']['p99']:.2f} ms",
        )
    )
    theirs, ours = results["channels-pubsub"], results["pubsub"]
    ctx.report.add(
        Figure(
            "channel layer one-way hop, Tether's pub/sub layer, p50",
            ours["p50"],
            "ms",
            theirs["p50"],
            "channels-redis pub/sub",
            note=f"p99 {ours['p99']:.2f} vs {theirs['p99']:.2f} ms; "
            f"CPU {ours['cpu']:.0f} vs {theirs['cpu']:.0f} µs a hop",
        )
    )


async def bench_echo_links(ctx: Context) -> None:
    """The direct link against Redis for a session's stream (issue 45): the same echo through the main stack
    (links on, the default) and a second daphne and worker with TETHER_LINKS=0, in turns, three rounds; each
    figure the median of the three, the three shown. Redis commands are counted over the whole Redis, so the
    two paths are measured one at a time."""
    from statistics import median

    samples = 1000 if ctx.quick else 5000
    runs: dict[str, list[dict]] = {"link": [], "Redis": []}
    redis = redis_pid(ctx.stack.redis_url)
    # The main worker's session first: a second worker started before it could claim it (and serve it via Redis).
    async with echoing(ctx) as viewer, second_stack(ctx, TETHER_LINKS="0") as (stack, other):
        paths = {
            "link": (viewer, daphne_pid(ctx), worker_pid(ctx)),
            "Redis": (other, stack.daphnes[0].pid, stack.workers[0].pid),
        }
        for _ in range(3):
            for name, (path_viewer, daphne, worker) in paths.items():
                pids = {"daphne": daphne, "worker": worker, "Redis": redis}
                before = {n: cpu_seconds(p) for n, p in pids.items()}
                commands = redis_commands(ctx.stack.redis_url)
                stats = summary(await echo_latency(path_viewer, samples))
                stats["commands"] = (redis_commands(ctx.stack.redis_url) - commands) / samples
                stats["cpu"] = sum(cpu_seconds(p) - before[n] for n, p in pids.items()) * 1000 / samples
                runs[name].append(stats)

    def shown(name: str, key: str, unit: str = "ms") -> str:
        return ", ".join(f"{run[key]:.3f}" for run in runs[name]) + f" {unit}"

    for key, label, unit in (
        ("p50", "echo p50", "ms"),
        ("p99", "echo p99", "ms"),
        ("cpu", "CPU per keystroke, daphne + worker + Redis", "ms"),
        ("commands", "Redis commands per keystroke", ""),
    ):
        linked, redis_only = (median(run[key] for run in runs[name]) for name in paths)
        ctx.report.add(
            Figure(
                f"{label} ({samples} samples, local), direct link",
                linked,
                unit,
                redis_only,
                "the same through Redis (TETHER_LINKS=0)",
                note=f"three rounds: link {shown('link', key, unit)}; Redis {shown('Redis', key, unit)}",
            )
        )
