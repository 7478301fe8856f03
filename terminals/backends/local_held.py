"""Local shells held by a session holder on this host, so that they outlive their worker.

The holder runs in its own session, apart from the worker; the program in another, under the holder. The
holder's directory (socket, exit record) is under TETHER_HOLDER_DIR, reachable only by this user, and its
secret lives in the lease's handle only. Tether's process marker and session label are set for the
program alone (``--setenv``), so the holder itself is never taken for part of the program's tree.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
from pathlib import Path

from terminals.backends.base import BackendError, Exit, Inspection, SpawnError, SpawnSpec, Status, Tags
from terminals.backends.config import holder_config
from terminals.backends.ending import terminate_descendants, terminate_tree
from terminals.backends.handles import LocalHandle, LocalHolder
from terminals.backends.holder import HeldProcess, holder_screens, ring_bytes
from terminals.backends.holder_wire import Session, SocketLink, parse_record, parse_started
from terminals.backends.procfs import MARKER_VARIABLE, ProcessIdentity, boot_id
from terminals.children import PIPE, Child

PROGRAM_ONLY = (MARKER_VARIABLE, "TETHER_SESSION")


def _dir_for(marker: str) -> Path:
    root = Path(holder_config().directory)
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    root.chmod(0o700)
    return root / marker


async def spawn_held(binary: Path, spec: SpawnSpec, tags: Tags, env: dict[str, str], cwd: str) -> HeldProcess:
    place = _dir_for(tags.marker)
    secret = secrets.token_hex(24)
    program_env = [f"{name}={env[name]}" for name in PROGRAM_ONLY if name in env]
    argv = [str(binary), "serve", str(place), "--cols", str(spec.cols), "--rows", str(spec.rows)]
    ring = ring_bytes()
    argv += ["--ring", str(ring), "--cwd", cwd]
    for assignment in program_env:
        argv += ["--setenv", assignment]
    starter = Child.start(
        [*argv, "--", *spec.argv],
        stdin=PIPE,
        stdout=PIPE,
        stderr=PIPE,
        env={name: value for name, value in env.items() if name not in PROGRAM_ONLY},
        start_new_session=True,
    )
    try:
        out, err = await asyncio.wait_for(starter.communicate(secret.encode() + b"\n"), 30)
    except BaseException:  # it said nothing in 30 s (or the worker is stopping): it is not left running
        await starter.end()
        raise
    text = out.decode(errors="replace")
    if starter.returncode != 0:
        shutil.rmtree(place, ignore_errors=True)
        raise SpawnError(text.removeprefix("error ").strip() or err.decode(errors="replace").strip())
    started = parse_started(text)
    screens = await asyncio.to_thread(holder_screens, binary)
    handle = LocalHandle(
        process=ProcessIdentity(pid=started.pid, start_time=started.start, boot_id=boot_id()),
        marker=tags.marker,
        holder=LocalHolder(
            dir=str(place),
            secret=secret,
            process=ProcessIdentity(pid=started.holder_pid, start_time=started.holder_start, boot_id=boot_id()),
            subreaper=started.subreaper,
            ring=ring,
            screens=screens or None,
        ),
    )
    return await attach_held(handle)


async def attach_held(handle: LocalHandle, since: int = 0) -> HeldProcess:
    holder = handle.holder

    async def connect(since: int):
        session = Session(await SocketLink.open(os.path.join(holder.dir, "sock")))
        try:
            return session, await session.attach(holder.secret, since, screens=bool(holder.screens))
        except BaseException:
            await session.link.close()
            raise

    session, attached = await connect(since)

    async def read_record() -> Exit | None:
        return await asyncio.to_thread(read_exit_record, handle)

    async def end_tree(grace: float) -> None:
        await end_held_tree(handle, grace)

    async def forget() -> None:
        await asyncio.to_thread(shutil.rmtree, holder.dir, True)

    async def alive() -> bool:
        return holder_alive(handle)

    return HeldProcess(
        handle, session, attached, reconnect=connect, read_record=read_record, end_tree=end_tree, forget=forget,
        holder_alive=alive,
    )  # fmt: skip


def read_exit_record(handle: LocalHandle) -> Exit | None:
    try:
        return parse_record(Path(handle.holder.dir, "exit").read_text())
    except OSError:
        return None


def holder_alive(handle: LocalHandle) -> bool:
    return handle.holder.process.is_alive()


async def inspect_held(handle: LocalHandle) -> Inspection:
    """The exit the holder recorded, once there is one; ALIVE while the program (or its holder, about to
    record its end) runs; else GONE."""
    holder, program = handle.holder.process, handle.process
    if (exit := await asyncio.to_thread(read_exit_record, handle)) is not None:
        alive = holder.is_alive()
        kept = "; its holder still keeps the last output" if alive else ""
        return Inspection(Status.EXITED, exit=exit, detail=f"the holder recorded: {exit.describe()}{kept}", held=alive)
    if holder.is_alive():
        detail = f"held by holder pid {holder.pid}; program pid {program.pid}"
        return Inspection(Status.ALIVE, detail=detail, held=True)
    if program.is_alive():
        return Inspection(Status.ALIVE, detail=f"pid {program.pid} runs on, but its holder is gone")
    return Inspection(Status.GONE, detail=f"holder pid {holder.pid} is gone and left no exit record")


async def remove_held(handle: LocalHandle, grace: float) -> None:
    """End a held program found through its handle (no owner holds it), then let its holder go."""
    if holder_alive(handle):
        try:
            process = await attach_held(handle)
        except BackendError:
            pass
        else:
            await process.terminate(grace=grace)
            await process.release()
            return
    await end_held_tree(handle, grace)


async def end_held_tree(handle: LocalHandle, grace: float) -> None:
    """End whatever the held program started. A holder that is a child subreaper has all of it below it
    (``terminate_descendants``: a few reads, where a pass over every process of the host costs each of many
    sessions ended at once as much as the host has processes); then one pass finds what left the tree
    through a daemon (an ``at`` job) with the marker still in its environment. A holder that is gone, or
    that could not be a subreaper, leaves the tree to be found by marker and session."""
    if handle.holder.subreaper:
        if await terminate_descendants(handle.holder.process, grace=grace):
            await terminate_tree(marker=handle.marker, grace=grace)
            return
    await terminate_tree(marker=handle.marker, leader=handle.process, grace=grace)
