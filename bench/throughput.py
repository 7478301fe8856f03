"""Output throughput on each backend against a raw PTY read, with the bytes hashed end to end."""

from __future__ import annotations

import asyncio
import hashlib
import os
import subprocess
import time
from pathlib import Path

from bench.common import Figure, RawPty, unique
from bench.sessions import MIB, Context, close_session, open_session


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


def _payload(received: bytes) -> bytes:
    """The file's bytes as the PTY delivered them (\\n became \\r\\n), without what came before or after."""
    body = received.split(b"__END__")[0]
    return body.lstrip(b"\r\n")


async def full_throughput(ctx: Context, backend: str, path: str, ref: str = "") -> tuple[float, str]:
    viewer, session = await open_session(
        ctx, ["/bin/sh", "-c", f"stty -echo; read x; cat {path}; echo __END__; exec cat"], backend, ref
    )
    try:
        await asyncio.sleep(0.3)
        began = time.perf_counter()
        await viewer.type(b"\r")
        while b"__END__" not in viewer.output[-4096:]:
            await viewer._next(30)
        elapsed = time.perf_counter() - began
        payload = _payload(bytes(viewer.output))
        return len(payload) / elapsed / MIB, hashlib.sha256(payload).hexdigest()
    finally:
        await viewer.close()
        await close_session(session)


async def backend_rate(backend, path: str) -> float:
    """A backend's own rate: its process read in this process, with no worker, Redis or WebSocket."""
    from terminals.backends.base import SpawnSpec, Tags
    from terminals.backends.procfs import ProcessIdentity

    me = ProcessIdentity.of(os.getpid())
    spec = SpawnSpec(argv=("/bin/sh", "-c", f"stty -echo; read x; cat {path}; echo __END__; exec cat"))
    process = await backend.spawn(spec, Tags("bench", me.pid, me.start_time))
    try:
        await asyncio.sleep(0.3)
        received = bytearray()
        began = time.perf_counter()
        await process.write(b"\r")
        while b"__END__" not in received[-4096:]:
            received += await process.read()
        return len(_payload(bytes(received))) / (time.perf_counter() - began) / MIB
    finally:
        await process.terminate(0.5)
        await process.release()


async def tmux_control_rate(path: str) -> float:
    """tmux's own rate: tmux control mode read in this process."""
    from terminals.backends.tmux import TmuxBackend

    socket = unique("tether-bench")
    try:
        return await backend_rate(TmuxBackend(socket), path)
    finally:
        subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True)


async def bench_throughput(ctx: Context, container: str | None) -> None:
    size = (50 if ctx.quick else 200) * MIB
    data = ctx.workdir / f"bench-{size // MIB}MB.b64"
    make_data(data, size)
    raw_rate, raw_hash = raw_throughput(data)
    for backend in ("local", "docker"):
        path, ref = str(data), ""
        if backend == "docker":
            if not container:
                ctx.report.notes.append("docker throughput skipped: no docker engine or image")
                continue
            subprocess.run(["docker", "cp", str(data), f"{container}:/tmp/bench.b64"], check=True)
            path, ref = "/tmp/bench.b64", container
        rate, digest = await full_throughput(ctx, backend, path, ref)
        if backend == "docker":
            from terminals.backends.docker import DockerBackend

            # dockerd relays the exec's TTY through containerd's shim and a hijacked HTTP stream: its
            # own rate, read in this process, says how much of the gap to a raw PTY is docker's.
            own = await backend_rate(DockerBackend(container=container, engine=""), path)
            ctx.report.add(
                Figure(
                    f"throughput, docker exec read in-process ({size // MIB} MB base64)",
                    own,
                    "MB/s",
                    raw_rate,
                    "raw PTY read",
                    note=f"Tether's docker path gets {rate / own:.0%} of this",
                )
            )
        ctx.report.add(
            Figure(
                f"throughput, {backend} ({size // MIB} MB base64)",
                rate,
                "MB/s",
                raw_rate,
                "raw PTY read",
                "≥ 40 MB/s and ≥ 50%",
                rate >= 40 and rate >= raw_rate / 2,
                note="hash matches" if digest == raw_hash else "HASH DIFFERS",
            )
        )
    tmux_size = min(size, 20 * MIB)
    tmux_data = ctx.workdir / f"bench-{tmux_size // MIB}MB.b64"
    make_data(tmux_data, tmux_size)
    control = await tmux_control_rate(str(tmux_data))
    rate, _ = await full_throughput(ctx, "tmux", str(tmux_data), unique("tether-bench"))
    ctx.report.add(
        Figure(
            f"throughput, tmux ({tmux_size // MIB} MB base64)",
            rate,
            "MB/s",
            control,
            "tmux control mode in-process",
            "≥ 80% of tmux",
            rate >= 0.8 * control,
        )
    )
