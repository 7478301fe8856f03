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


async def terminado_throughput(path: Path) -> tuple[float, str]:
    """The peer's rate: the same program and file through terminado, read by the same kind of client."""
    from bench.terminado_peer import terminado_output

    received, elapsed = await terminado_output(["/bin/sh", "-c", f"stty -echo; read x; cat {path}; echo __END__"])
    payload = _payload(received)
    return len(payload) / elapsed / MIB, hashlib.sha256(payload).hexdigest()


def _matches(digest: str, raw: str) -> str:
    return "hash matches" if digest == raw else "HASH DIFFERS"


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
    peer_rate, peer_hash = await terminado_throughput(data)
    ctx.report.add(
        Figure(
            f"throughput, terminado ({size // MIB} MB base64)",
            peer_rate,
            "MB/s",
            raw_rate,
            "raw PTY read",
            note=_matches(peer_hash, raw_hash),
        )
    )
    rate, digest = await full_throughput(ctx, "local", str(data))
    ctx.report.add(
        Figure(
            f"throughput, local ({size // MIB} MB base64)",
            rate,
            "MB/s",
            peer_rate,
            "terminado",
            "≥ 1.5x terminado",
            rate >= 1.5 * peer_rate,
            note=f"{rate / raw_rate:.0%} of a raw PTY read; "
            + ("hash matches" if digest == raw_hash else "HASH DIFFERS"),
        )
    )
    if not container:
        ctx.report.notes.append("docker throughput skipped: no docker engine or image")
    else:
        from terminals.backends.docker import DockerBackend

        subprocess.run(["docker", "cp", str(data), f"{container}:/tmp/bench.b64"], check=True)
        rate, digest = await full_throughput(ctx, "docker", "/tmp/bench.b64", container)
        # dockerd relays the exec's TTY through containerd's shim and a hijacked HTTP stream: its own rate,
        # read in this process with no worker, Redis or WebSocket, is what Tether's docker path can reach.
        own = await backend_rate(DockerBackend(container=container, engine=""), "/tmp/bench.b64")
        ctx.report.add(
            Figure(
                f"throughput, docker ({size // MIB} MB base64)",
                rate,
                "MB/s",
                own,
                "docker exec read in-process",
                "≥ 95% of docker's relay",
                rate >= 0.95 * own,
                note=f"{rate / raw_rate:.0%} of a raw PTY read; {_matches(digest, raw_hash)}",
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
            "≥ 90% of tmux",
            rate >= 0.9 * control,
        )
    )
