"""Output throughput on each backend against a raw PTY read, with the bytes hashed end to end."""

from __future__ import annotations

import asyncio
import hashlib
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from asgiref.sync import sync_to_async

from bench.common import Figure, RawPty, cpu_seconds, machine_busy, postgres_cpu, postgres_since, redis_pid, unique
from bench.sessions import MIB, Context, close_session, daphne_pid, open_session, worker_pid


def make_data(path: Path, size: int) -> None:
    if path.exists() and path.stat().st_size == size:
        return
    raw = size * 3 // 4
    with open(path, "wb") as out:
        subprocess.run(
            f"head -c {raw} /dev/urandom | base64 -w 76 | head -c {size}", shell=True, stdout=out, check=True
        )


def raw_throughput(path: Path) -> tuple[float, str]:
    raw = RawPty(["/bin/sh", "-c", f"stty -echo; read x; cat {path}; echo __END__"])
    try:
        time.sleep(0.3)
        received = bytearray()
        began = time.perf_counter()
        raw.write(b"\n")
        while b"__END__" not in received[-64:]:
            chunk = raw.read()
            if not chunk:
                break
            received += chunk
        elapsed = time.perf_counter() - began
        payload = _payload(bytes(received))
        return len(payload) / elapsed / MIB, hashlib.sha256(payload).hexdigest()
    finally:
        raw.close()


async def terminado_throughput(path: Path) -> tuple[float, str, float]:
    """The peer's rate: the same program and file through terminado, read by the same kind of client; and
    its server's CPU milliseconds per MB."""
    from bench.terminado_peer import terminado_output

    argv = ["/bin/sh", "-c", f"stty -echo; read x; cat {path}; echo __END__"]
    received, elapsed, cpu = await terminado_output(argv)
    payload = _payload(received)
    mb = len(payload) / MIB
    return mb / elapsed, hashlib.sha256(payload).hexdigest(), cpu * 1000 / mb


def _matches(digest: str, raw: str) -> str:
    return "hash matches" if digest == raw else "HASH DIFFERS"


def _payload(received: bytes) -> bytes:
    """The file's bytes as the PTY delivered them (\\n became \\r\\n), without what came before or after."""
    body = received.split(b"__END__")[0]
    return body.lstrip(b"\r\n")


@dataclass
class Streamed:
    rate: float  # MB/s
    digest: str
    cpu_ms_per_mb: dict[str, float]  # by process, while the output streamed
    cores: float  # how many of the machine's cores were busy meanwhile, whoever used them
    saved_seconds: float | None  # from the session's end until its recording was a file (None: not recorded)


async def full_throughput(ctx: Context, backend: str, path: str, ref: str = "") -> Streamed:
    """The file through the full path. Then, before the next figure, the session's recording is waited for
    until it is a file: finishing it (reading its chunks back, gzip) costs CPU that would otherwise be taken
    from whatever is measured next."""
    viewer, session = await open_session(
        ctx, ["/bin/sh", "-c", f"stty -echo; read x; cat {path}; echo __END__; exec cat"], backend, ref
    )
    processes = {"daphne": daphne_pid(ctx), "worker": worker_pid(ctx), "Redis": redis_pid(ctx.stack.redis_url)}
    try:
        await asyncio.sleep(0.3)
        before = {name: cpu_seconds(pid) for name, pid in processes.items()}
        postgres, busy = postgres_cpu(), machine_busy()
        began = time.perf_counter()
        await viewer.type(b"\r")
        while b"__END__" not in viewer.output[-4096:]:
            await viewer._next(30)
        elapsed = time.perf_counter() - began
        cores = (machine_busy() - busy) / elapsed
        used = {name: cpu_seconds(pid) - before[name] for name, pid in processes.items()}
        used["PostgreSQL"] = postgres_since(postgres)
        payload = _payload(bytes(viewer.output))
        mb = len(payload) / MIB
        cpu = {name: seconds * 1000 / mb for name, seconds in used.items()}
    finally:
        await viewer.close()
        await close_session(session)
    ended = time.perf_counter()
    saved = await _recording_saved(session)
    if saved is False:
        ctx.report.notes.append(f"{backend} throughput: its recording was not a file 300 s after the session ended")
    saved_seconds = time.perf_counter() - ended if saved else None
    return Streamed(mb / elapsed, hashlib.sha256(payload).hexdigest(), cpu, cores, saved_seconds)


def _where_it_went(streamed: Streamed, relay_cores: float) -> str:
    """Where a megabyte's time went on its way through Tether, and how full the machine was: with every core
    busy the rate is the machine's, and only less CPU per MB (anywhere) raises it."""
    parts = ", ".join(f"{name} {ms:.0f}" for name, ms in streamed.cpu_ms_per_mb.items())
    return (
        f"CPU per MB {sum(streamed.cpu_ms_per_mb.values()):.0f} ms ({parts}); cores busy {streamed.cores:.2f}"
        f" of {os.cpu_count()}, {relay_cores:.2f} while its relay was read in-process"
    )


async def _recording_saved(session, timeout: float = 300) -> bool | None:
    """Whether the session's recording became a file (None: it had no recording, e.g. TETHER_RECORDINGS=0)."""
    from recordings.models import Recording, RecordingState

    def states() -> set[str]:
        return set(Recording.objects.filter(session_id=session.pk).values_list("state", flat=True))

    if not await sync_to_async(states)():
        return None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await sync_to_async(states)() <= {RecordingState.SAVED}:
            return True
        await asyncio.sleep(0.2)
    return False


async def backend_rate(backend, path: str) -> float:
    """A backend's own rate: its process read in this process, with no worker, Redis or WebSocket."""
    return (await backend_run(backend, path))[0]


async def backend_run(backend, path: str) -> tuple[float, float]:
    """``backend_rate``, and how many of the machine's cores were busy meanwhile."""
    from terminals.backends.base import SpawnSpec, Tags
    from terminals.backends.procfs import ProcessIdentity

    me = ProcessIdentity.of(os.getpid())
    spec = SpawnSpec(argv=("/bin/sh", "-c", f"stty -echo; read x; cat {path}; echo __END__; exec cat"))
    process = await backend.spawn(spec, Tags("bench", me.pid, me.start_time))
    try:
        await asyncio.sleep(0.3)
        received = bytearray()
        busy, began = machine_busy(), time.perf_counter()
        await process.write(b"\r")
        while b"__END__" not in received[-4096:]:
            received += await process.read()
        elapsed = time.perf_counter() - began
        return len(_payload(bytes(received))) / elapsed / MIB, (machine_busy() - busy) / elapsed
    finally:
        await process.terminate(0.5)
        await process.release()


async def tmux_control_rate(path: str) -> tuple[float, float]:
    """tmux's own rate: tmux control mode read in this process (and the machine's cores busy meanwhile)."""
    from terminals.backends.tmux import TmuxBackend

    socket = unique("tether-bench")
    try:
        return await backend_run(TmuxBackend(socket), path)
    finally:
        subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True)


ROUNDS = 3  # each figure and its peer alternate this many times, the best of each kept: this machine's rate
# for one read moves by a fifth from one run to the next (docs/benchmarks.md)


async def best_of(ours, peer) -> tuple:
    """Alternate ``ours()`` and ``peer()`` ROUNDS times; the best result of each (the highest rate, which both
    put first or name ``rate``)."""
    mine, theirs = [], []
    for _ in range(ROUNDS):
        theirs.append(await peer())
        mine.append(await ours())

    def rate(result) -> float:
        return result.rate if isinstance(result, Streamed) else result[0]

    return max(mine, key=rate), max(theirs, key=rate)


async def bench_throughput(ctx: Context, container: str | None) -> None:
    size = (50 if ctx.quick else 200) * MIB
    data = ctx.workdir / f"bench-{size // MIB}MB.b64"
    make_data(data, size)
    # The raw PTY read, best of ROUNDS too (one read moved by a fifth from run to run): the ceiling, not a sample.
    raws = [raw_throughput(data) for _ in range(ROUNDS)]
    raw_rate, raw_hash = max(raws)
    raw_note = f"raw PTY reads {', '.join(f'{rate:.1f}' for rate, _ in raws)} MB/s, the best kept"
    local, (peer_rate, peer_hash, peer_cpu) = await best_of(
        lambda: full_throughput(ctx, "local", str(data)), lambda: terminado_throughput(data)
    )
    rounds = f"best of {ROUNDS} each, alternating"
    ctx.report.add(
        Figure(
            f"throughput, terminado ({size // MIB} MB base64)",
            peer_rate,
            "MB/s",
            raw_rate,
            "raw PTY read",
            note=f"{_matches(peer_hash, raw_hash)}; {rounds}; {raw_note}",
        )
    )
    ctx.report.add(
        Figure(
            f"throughput, local ({size // MIB} MB base64)",
            local.rate,
            "MB/s",
            peer_rate,
            "terminado",
            # (Issue 45: 1.5x terminado was 90% of a raw PTY read on this machine, unfair: restated.)
            "≥ 1.0x terminado and ≥ 80% of the best raw PTY read",
            local.rate >= peer_rate and local.rate >= 0.8 * raw_rate,
            note=f"{local.rate / raw_rate:.0%} of a raw PTY read; {_matches(local.digest, raw_hash)}; "
            + f"cores busy {local.cores:.2f} of {os.cpu_count()}; {rounds}",
        )
    )
    # Where a megabyte's time goes: the CPU each process spends on it, against terminado's one process.
    ctx.report.add(
        Figure(
            "CPU per MB of output, local: daphne + worker + Redis + PostgreSQL ("
            + ", ".join(f"{name} {ms:.0f}" for name, ms in local.cpu_ms_per_mb.items())
            + " ms; the best runs')",
            sum(local.cpu_ms_per_mb.values()),
            "ms",
            peer_cpu,
            "terminado's server",
            "≤ terminado's server",  # issue 45's goal
            sum(local.cpu_ms_per_mb.values()) <= peer_cpu,
        )
    )
    if local.saved_seconds is not None:
        ctx.report.add(
            Figure(
                f"its recording made a file ({size // MIB} MB of output; waited for before the next figure)",
                local.saved_seconds,
                "s",
                size / MIB / local.rate,
                "the output's own streaming time",
            )
        )
    if not container:
        ctx.report.notes.append("docker throughput skipped: no docker engine or image")
    else:
        from terminals.backends.docker import DockerBackend

        subprocess.run(["docker", "cp", str(data), f"{container}:/tmp/bench.b64"], check=True)
        # dockerd relays the exec's TTY through containerd's shim and a hijacked HTTP stream: its own rate,
        # read in this process with no worker, Redis or WebSocket, is what Tether's docker path can reach.
        docker, (own, own_cores) = await best_of(
            lambda: full_throughput(ctx, "docker", "/tmp/bench.b64", container),
            lambda: backend_run(DockerBackend(container=container, engine=""), "/tmp/bench.b64"),
        )
        ctx.report.add(
            Figure(
                f"throughput, docker ({size // MIB} MB base64)",
                docker.rate,
                "MB/s",
                own,
                "docker exec read in-process",
                "≥ 85% of docker's relay read in-process",  # (issue 45: its relay alone keeps 1.7 cores busy)
                docker.rate >= 0.85 * own,
                note=f"{docker.rate / raw_rate:.0%} of a raw PTY read; {_matches(docker.digest, raw_hash)}; "
                + f"{_where_it_went(docker, own_cores)}; {rounds}",
            )
        )
    tmux_size = min(size, 20 * MIB)
    tmux_data = ctx.workdir / f"bench-{tmux_size // MIB}MB.b64"
    make_data(tmux_data, tmux_size)
    tmux, (control, control_cores) = await best_of(
        lambda: full_throughput(ctx, "tmux", str(tmux_data), unique("tether-bench")),
        lambda: tmux_control_rate(str(tmux_data)),
    )
    ctx.report.add(
        Figure(
            f"throughput, tmux ({tmux_size // MIB} MB base64)",
            tmux.rate,
            "MB/s",
            control,
            "tmux control mode in-process",
            "≥ 85% of control mode read in-process",  # (issue 45's goal)
            tmux.rate >= 0.85 * control,
            note=f"{_where_it_went(tmux, control_cores)}; {rounds}",
        )
    )
