"""Density (idle sessions per worker) and churn (sessions opened, viewed and closed), with leftovers counted."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from pathlib import Path

from asgiref.sync import sync_to_async

from bench.common import Figure, cpu_seconds, rss_kib, unique, wait_until
from bench.sessions import Context, close_all, machine_for, terminal_for, worker_pid


async def _wait_all(ids: list[int], state: str, timeout: float = 900) -> None:
    from executions.models import Execution

    await wait_until(
        lambda: sync_to_async(lambda: Execution.objects.filter(pk__in=ids, state=state).count() == len(ids))(),
        timeout=timeout,
        interval=0.5,
    )


async def bench_density(ctx: Context) -> None:
    """Idle sessions held by one worker: its memory per session (the shells' own excluded) and idle CPU."""
    # Full: the 5,000 local sessions of the performance issue; tmux 1,000 (each pane also runs tmux's shim,
    # a Python process of about 10 MiB: 5,000 would need 50 GiB for the shims alone).
    for backend, count in (("local", 100 if ctx.quick else 5000), ("tmux", 100 if ctx.quick else 1000)):
        count = ctx.sizes.get(f"density.{backend}", count)  # --size density.local=2000
        if not count:
            continue
        _enough_ptys(count)
        # A fresh worker for each: memory the last benchmark's sessions freed would otherwise be reused.
        old = ctx.stack.workers[-1]
        old.send_signal(signal.SIGTERM)
        await sync_to_async(old.wait)()
        await sync_to_async(ctx.stack.start_worker)("local,tmux,docker")
        worker = worker_pid(ctx)
        base_rss = rss_kib(worker)
        socket = unique("tether-bench")  # one tmux server for all of them, as on a real host
        marker = unique("density")
        machines = [
            await sync_to_async(machine_for)(backend, socket if backend == "tmux" else "") for _ in range(count)
        ]
        shell = ["/bin/sh", "-c", f"sleep 2147483; : {marker}"]
        sessions = await sync_to_async(
            lambda machines=machines, shell=shell: [terminal_for(m, ctx.user, shell) for m in machines]
        )()
        await _wait_all([s.execution_id for s in sessions], "running")
        await asyncio.sleep(3)
        per_session = (rss_kib(worker) - base_rss) / count
        # Baseline: what each session's shell takes itself (for tmux, with its pane's shim).
        own = sum(rss_kib(int(line.split()[0])) for line in _processes(marker, socket, quiet=True)) / count
        cpu_before = cpu_seconds(worker)
        await asyncio.sleep(10)
        cpu_idle = (cpu_seconds(worker) - cpu_before) / 10 * 100
        ctx.report.add(
            Figure(
                f"density: worker RSS per idle {backend} session ({count})",
                per_session,
                "KiB",
                own,
                "its shell's own RSS",
                goal="≤ 1 MiB",
                met=per_session <= 1024,
            )
        )
        ctx.report.add(Figure(f"density: worker CPU with {count} idle {backend} sessions", cpu_idle, "% of a core"))
        began = time.monotonic()
        asking = await close_all(sessions)
        closing = time.monotonic() - began
        unknown = await sync_to_async(_unknown)([s.execution_id for s in sessions])
        ctx.report.add(
            Figure(
                f"density: {backend} sessions closed per second, all {count} at once",
                count / closing,
                "/s",
                note=f"{closing:.1f} s from the first Kill to the last closed (the Kills asked in {asking:.1f} s); "
                f"{unknown} recorded unknown",
            )
        )
        leftovers = _processes(marker, socket if backend == "tmux" else "")
        ctx.report.add(
            Figure(
                f"density: {backend} processes left after closing {count}",
                len(leftovers),
                "",
                goal="0",
                met=not leftovers,
            )
        )
        if backend == "tmux":
            subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True)


def _unknown(ids: list[int]) -> int:
    """Executions recorded ``unknown``: the worker could not prove the end its Kill made."""
    from executions.models import Execution

    return Execution.objects.filter(pk__in=ids, state="unknown").count()


PTY_MAX, PTY_NR = Path("/proc/sys/kernel/pty/max"), Path("/proc/sys/kernel/pty/nr")


def _enough_ptys(sessions: int) -> None:
    """Every shell has a terminal, and Linux gives out 4,096 by default (kernel.pty.max): 920 of 5,000 idle
    shells failed to start on it. Raised here when it is too low (as root), else the benchmark says why."""
    wanted = sessions + int(PTY_NR.read_text()) + 512
    if int(PTY_MAX.read_text()) >= wanted:
        return
    try:
        PTY_MAX.write_text(f"{wanted}\n")
    except OSError as error:
        raise RuntimeError(f"{sessions} shells need kernel.pty.max of at least {wanted}: {error}") from None


def _processes(marker: str, tmux_socket: str = "", quiet: bool = False) -> list[str]:
    """Live processes whose command line names ``marker``, less the tmux server of ``tmux_socket``: it
    carries the command line of the spawn that started it, and is kept running on purpose (exit-empty off)."""
    server = _tmux_server(tmux_socket) if tmux_socket else ""
    lines = subprocess.run(["pgrep", "-af", marker], capture_output=True, text=True).stdout.splitlines()
    lines = [line for line in lines if line.split()[0] != server]
    for line in lines if not quiet else ():
        print(f"  still running: {line[:200]}", flush=True)
    return lines


def _tmux_server(socket: str) -> str:
    """The pid of the socket's tmux server, which carries the command line of the spawn that started it."""
    done = subprocess.run(["tmux", "-L", socket, "display-message", "-p", "#{pid}"], capture_output=True, text=True)
    return done.stdout.strip()


def _tmux_sessions(socket: str) -> int:
    done = subprocess.run(["tmux", "-L", socket, "list-sessions", "-F", "#S"], capture_output=True, text=True)
    return len(done.stdout.split())


def _redis_counts(url: str, prefix: str) -> tuple[int, int, int]:
    """(keys under the channel prefix, pub/sub channels under it, client connections) in Redis."""
    import redis

    client = redis.Redis.from_url(url)
    try:
        keys = sum(1 for _ in client.scan_iter(match=f"{prefix}*", count=1000))
        channels = len(client.pubsub_channels(f"{prefix}*"))
        return keys, channels, len(client.client_list())
    finally:
        client.close()


async def bench_churn(ctx: Context) -> None:
    """Sessions opened, viewed, typed into and closed, many times over, in parallel lanes: afterwards
    nothing may be left (shells, tmux sessions, Redis keys, subscriptions or connections)."""
    count = 200 if ctx.quick else 2000
    lanes = 10
    socket = unique("tether-bench")
    marker = unique("churn")
    prefix = ctx.stack.prefix
    done = total = 0

    async def lane(number: int) -> None:
        nonlocal done
        backend = "tmux" if number % 2 else "local"
        machine = await sync_to_async(machine_for)(backend, socket if backend == "tmux" else "")
        shell = ["/bin/sh", "-c", f"echo READY; sleep 2147483; : {marker}"]
        while done < total:
            done += 1
            session = await sync_to_async(terminal_for)(machine, ctx.user, shell)
            from tests.bridge.harness import Viewer

            viewer = await Viewer.open(ctx.stack.ports[0], session.id, ctx.cookie)
            await viewer.attach()
            await viewer.read_until(b"READY", timeout=60)
            await viewer.close()
            await close_all([session])

    # A first round warms the connection pools (they keep as many connections as were ever busy at
    # once): what is counted after the churn proper is then what the churn itself left.
    total = 2 * lanes
    await asyncio.gather(*(lane(n) for n in range(lanes)))
    await asyncio.sleep(3)
    before = _redis_counts(ctx.stack.redis_url, prefix)
    total += count
    began = time.monotonic()
    await asyncio.gather(*(lane(n) for n in range(lanes)))
    elapsed = time.monotonic() - began
    await asyncio.sleep(3)  # let the last closes settle
    after = _redis_counts(ctx.stack.redis_url, prefix)
    left = {
        "shells": len(_processes(marker, socket)),
        "tmux sessions": _tmux_sessions(socket),
        "Redis keys": after[0] - before[0],
        "Redis subscriptions": after[1] - before[1],
        "Redis connections": after[2] - before[2],
    }
    subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True)
    ctx.report.add(
        Figure(
            f"churn: {count} sessions opened, viewed and closed ({lanes} at a time, local and tmux): left over",
            sum(max(v, 0) for v in left.values()),
            "",
            goal="0",
            met=all(v <= 0 for v in left.values()),
            note=", ".join(f"{k} {v}" for k, v in left.items()) + f"; {count / elapsed:.1f} sessions/s",
        )
    )
