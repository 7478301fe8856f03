"""The session holder's cost, each figure against the plain path measured in the same run: a held shell's
output rate and echo against the worker's own PTY (local) or a bare exec (docker), the holder's memory per
idle session, and kill -9 of a worker to its held shells adopted by the next."""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import time

from bench.common import Figure
from bench.endurance import kill_to_adopted
from bench.sessions import MIB, Context
from bench.throughput import backend_rate, make_data

ROUNDS = 3  # held and plain alternate, each's best kept: a noisy second on a 2-core machine hits both


def _backends(container: str | None):
    from terminals.backends.docker import DockerBackend
    from terminals.backends.local import LocalBackend

    yield "local", LocalBackend(holder=None), LocalBackend(), ""
    if container:
        yield "docker", DockerBackend(container=container, holder=None), DockerBackend(container=container), container


async def _echo(backend, samples: int) -> list[float]:
    """Milliseconds from writing a byte to reading its echo, the backend's process read in this process."""
    from terminals.backends.base import SpawnSpec, Tags
    from terminals.backends.procfs import ProcessIdentity

    me = ProcessIdentity.of(os.getpid())
    process = await backend.spawn(SpawnSpec(argv=("/bin/sh", "-c", "exec cat")), Tags("bench", me.pid, me.start_time))
    try:
        await asyncio.sleep(0.3)
        times = []
        for n in range(samples + 20):
            key = bytes([97 + n % 26])
            began = time.perf_counter()
            await process.write(key)
            seen = b""
            while key not in seen:
                seen += await asyncio.wait_for(process.read(), 10)
            if n >= 20:  # warmed up
                times.append((time.perf_counter() - began) * 1000)
        return times
    finally:
        await process.terminate(0.5)
        await process.release()


def _p(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1]


async def bench_holder(ctx: Context, container: str | None) -> None:
    size = (50 if ctx.quick else 200) * MIB
    data = ctx.workdir / f"bench-{size // MIB}MB.b64"
    make_data(data, size)
    samples = 300 if ctx.quick else 2000
    for name, plain, held, ref in _backends(container):
        path = str(data)
        if ref:
            subprocess.run(["docker", "cp", path, f"{ref}:/tmp/bench.b64"], check=True)
            path = "/tmp/bench.b64"
        rates = {"plain": [], "held": []}
        for _ in range(ROUNDS):
            for kind, backend in (("plain", plain), ("held", held)):
                rates[kind].append(await backend_rate(backend, path))
        plain_rate, held_rate = max(rates["plain"]), max(rates["held"])
        ctx.report.add(
            Figure(
                f"holder: {name} throughput, held ({size // MIB} MB base64, in-process)",
                held_rate,
                "MB/s",
                plain_rate,
                "plain " + ("PTY" if name == "local" else "docker exec"),
                "≥ 90% of plain",
                held_rate >= 0.9 * plain_rate,
                note=f"best of {ROUNDS} each, alternating",
            )
        )
        plain_echo, held_echo = await _echo(plain, samples), await _echo(held, samples)
        for q in (50, 99):
            above = _p(held_echo, q) - _p(plain_echo, q)
            ctx.report.add(
                Figure(
                    f"holder: {name} echo p{q}, held (in-process)",
                    _p(held_echo, q),
                    "ms",
                    _p(plain_echo, q),
                    "plain",
                    "≤ plain + 0.2 ms" if q == 50 else "",
                    above <= 0.2 if q == 50 else None,
                    note=f"{above:+.3f} ms; {samples} keystrokes",
                )
            )
    await _idle_memory(ctx)
    for backend, ref in (("local", ""), ("docker", container)):
        if backend == "docker" and not container:
            continue
        await kill_to_adopted(ctx, backend, ref, "holder", f"held {backend}")


def _rss_kib(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


async def _idle_memory(ctx: Context) -> None:
    """RSS of the holders of idle local shells, per session; and closing them leaves nothing behind."""
    from terminals.backends.base import SpawnSpec, Tags
    from terminals.backends.local import LocalBackend
    from terminals.backends.procfs import ProcessIdentity, find_tree

    count = 50 if ctx.quick else 500
    me = ProcessIdentity.of(os.getpid())
    backend = LocalBackend()
    processes = []
    for n in range(count):
        tags = Tags(f"bench-idle-{n}", me.pid, me.start_time)
        processes.append(await backend.spawn(SpawnSpec(argv=("/bin/sh", "-c", "echo up; exec cat")), tags))
    for process in processes:
        await process.read()  # "up": each holder has served output once
    await asyncio.sleep(0.5)
    holders = [p.handle.holder.process for p in processes]
    per_session = sum(_rss_kib(holder.pid) for holder in holders) / count
    for process in processes:
        await process.terminate(0.2)
        await process.release()
    await asyncio.sleep(0.5)
    left = [holder for holder in holders if holder.is_alive()]  # by pid and start time: never another's
    left += [p for process in processes for p in find_tree(marker=process.handle.marker)]
    ctx.report.add(
        Figure(
            f"holder: RSS per idle held session ({count} sessions)",
            per_session / 1024,
            "MiB",
            goal="≤ 1 MiB",
            met=per_session <= 1024,
            note=f"{per_session:.0f} KiB each; after closing them all, {len(left)} process(es) left",
        )
    )
