"""Docker shells held by a session holder inside their container, so that they outlive their worker.

Docker cannot attach a new client to a running exec, so the program is not the exec's: the worker copies
the holder into the container (``/tmp/.tether/holder-<digest>``, reused while the same build is there),
starts it with one exec (``serve``: it returns once the holder listens), and talks to it through a second
exec running the holder's relay (``attach``, without a terminal: docker passes its stdin on unscanned, so
no byte is taken for a detach key, and frames its stdout, which ``RelayLink`` takes apart). A worker on
any host that reaches the engine attaches the same way after the first one died, from the offset it
needs, and reads the exit from the holder's record, never from a dropped exec's status.

Where the holder cannot run (a read-only or full filesystem, another CPU architecture), ``Unheld`` says
why, and the backend falls back to a plain exec that ends with its worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import platform
import secrets
import struct
import tarfile
from dataclasses import replace
from pathlib import Path

import docker
from docker.errors import APIError, NotFound

from terminals.backends.base import BackendError, Exit, Inspection, SpawnError, SpawnSpec, Status, Tags
from terminals.backends.docker_exec import ENGINE_ERRORS, end_tree, exec_state
from terminals.backends.docker_process import DockerProcess
from terminals.backends.handles import DockerHandle, DockerHolder, Launch
from terminals.backends.holder import HeldProcess, holder_screens, ring_bytes
from terminals.backends.holder_wire import Session, parse_record, parse_started
from terminals.backends.procfs import MARKER_VARIABLE

ROOT = "/tmp/.tether"  # Tether's own directory in the container
PROGRAM_ONLY = (MARKER_VARIABLE, "TETHER_SESSION")
ARCHITECTURES = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "i686": "386"}
# (engine id, container id, source) -> its path there, once copied and checked
_installed: dict[tuple[str, str, str], str] = {}


class Unheld(Exception):
    """The holder cannot run in this container: why (the shell then ends with its worker)."""


def _digest(binary: Path) -> str:
    return hashlib.sha256(binary.read_bytes()).hexdigest()


def _tar_of(binary: Path, name: str) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for directory in (".tether",):
            info = tarfile.TarInfo(directory)
            info.type, info.mode = tarfile.DIRTYPE, 0o700
            tar.addfile(info)
        data = binary.read_bytes()
        info = tarfile.TarInfo(f".tether/{name}")
        info.size, info.mode = len(data), 0o755
        tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _read_archive(api: docker.APIClient, container: str, path: str) -> bytes | None:
    """A file's content from the container (running or stopped: no exec, no shell needed), None if absent."""
    try:
        stream, _ = api.get_archive(container, path)
    except NotFound:
        return None
    with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
        member = tar.next()
        extracted = tar.extractfile(member) if member is not None else None
        return extracted.read() if extracted is not None else None


async def install(api: docker.APIClient, engine_id: str, container: str, binary: Path) -> str:
    """The holder's path in ``container``: copied there when missing, and checked by its digest."""
    if (known := _installed.get((engine_id, container, str(binary)))) is not None:
        return known
    info = await asyncio.to_thread(api.inspect_container, container)
    image = await asyncio.to_thread(api.inspect_image, info["Image"])
    mine = ARCHITECTURES.get(platform.machine(), platform.machine())
    if image.get("Architecture") and image["Architecture"] != mine:
        raise Unheld(f"the container is {image['Architecture']}, the holder was built for {mine}")
    return await place(api, engine_id, container, binary, "holder", "the holder")


async def place(api: docker.APIClient, engine_id: str, container: str, source: Path, prefix: str, what: str) -> str:
    """``source``'s path in ``container`` (``ROOT/PREFIX-DIGEST``): copied there when missing, and checked by
    its digest. Raises Unheld when it cannot be placed there."""
    if (known := _installed.get((engine_id, container, str(source)))) is not None:
        return known
    digest = await asyncio.to_thread(_digest, source)
    name = f"{prefix}-{digest[:16]}"
    path = f"{ROOT}/{name}"
    there = await asyncio.to_thread(_read_archive, api, container, path)
    if there is None or hashlib.sha256(there).hexdigest() != digest:
        try:
            placed = await asyncio.to_thread(api.put_archive, container, "/tmp", _tar_of(source, name))
        except APIError as error:
            raise Unheld(f"{what} cannot be copied into the container: {error.explanation}") from None
        there = await asyncio.to_thread(_read_archive, api, container, path) if placed else None
        if there is None or hashlib.sha256(there).hexdigest() != digest:
            raise Unheld(f"{what} copied into the container does not read back the same (read-only /tmp?)")
    _installed[(engine_id, container, str(source))] = path
    return path


def _split(raw: bytes | bytearray) -> tuple[bytes, bytes, int]:
    """A non-terminal exec's output as docker frames it (8 bytes before each piece: the stream, 1 stdout or
    2 stderr, three zeros, the length): (stdout, stderr, bytes taken) of the whole pieces in ``raw``."""
    out, err, at = [], [], 0
    while len(raw) - at >= 8:
        kind, size = raw[at], struct.unpack_from(">I", raw, at + 4)[0]
        if len(raw) - at < 8 + size:
            break
        (err if kind == 2 else out).append(bytes(raw[at + 8 : at + 8 + size]))
        at += 8 + size
    return b"".join(out), b"".join(err), at


async def _run(api: docker.APIClient, container: str, argv: list[str], stdin: bytes = b"", **create) -> str:
    """Run a short exec to its end, with ``stdin`` written first; its stdout as text."""
    created = await asyncio.to_thread(api.exec_create, container, argv, stdin=bool(stdin), tty=False, **create)
    return await _start(api, created["Id"], stdin)


async def _start(api: docker.APIClient, exec_id: str, stdin: bytes = b"", *, one_line: bool = False) -> str:
    """Start a created exec, write ``stdin``, and read its stdout to the end, as text; with ``one_line``, up to
    its first line (the exec goes on: closing the connection does not end it)."""

    def run() -> str:
        if not stdin:
            return api.exec_start(exec_id).decode(errors="replace")
        conn = api.exec_start(exec_id, socket=True)
        sock = getattr(conn, "_sock", conn)
        raw = bytearray()
        try:
            sock.settimeout(30)
            sock.sendall(stdin)
            while chunk := sock.recv(65536):
                raw += chunk
                if one_line and b"\n" in _split(raw)[0]:
                    break
        finally:
            with contextlib.suppress(OSError):
                sock.close()
        out = _split(raw)[0].decode(errors="replace")
        return out.split("\n", 1)[0] + "\n" if one_line and "\n" in out else out

    return await asyncio.to_thread(run)


async def spawn_held(
    api: docker.APIClient, engine: str, engine_id: str, container: str, binary: Path, spec: SpawnSpec, tags: Tags,
    env: dict[str, str], before_start,
) -> HeldProcess:  # fmt: skip
    """Raises Unheld when the holder cannot run there (nothing was started), SpawnError when the program
    could not be started."""
    holder = await install(api, engine_id, container, binary)
    screens = await asyncio.to_thread(holder_screens, binary)
    place = f"{ROOT}/s-{tags.marker}"
    secret = secrets.token_hex(24)
    ring = ring_bytes()
    # --reap: serve stays, the parent that reaps the holder and whatever is orphaned below it (a container's
    # PID 1 often reaps nothing, and each of them would stay a zombie).
    argv = [holder, "serve", place, "--cols", str(spec.cols), "--rows", str(spec.rows), "--ring", str(ring), "--reap"]
    for name in PROGRAM_ONLY:
        if name in env:
            argv += ["--setenv", f"{name}={env[name]}"]
    held_env = {name: value for name, value in env.items() if name not in PROGRAM_ONLY}
    handle = DockerHandle(
        engine=engine, container=container, marker=tags.marker, session=tags.session, owner_pid=tags.owner_pid,
        owner_started_at=tags.owner_started_at,
        holder=DockerHolder(binary=holder, dir=place, secret=secret, ring=ring, screens=screens or None),
    )  # fmt: skip
    try:
        created = await asyncio.to_thread(
            api.exec_create, container, [*argv, "--", *spec.argv], stdin=True, tty=False, environment=held_env,
            workdir=spec.cwd or None,
        )  # fmt: skip
        handle = replace(handle, exec_id=created["Id"])  # the serve exec: created, not started, proves nothing ran
        if before_start is not None:
            # Kept before anything can run: recovery finds the holder (or the unstarted exec) from it.
            await before_start(handle)
        text = await _start(api, created["Id"], f"{secret}\n".encode(), one_line=True)
    except APIError as error:
        raise SpawnError(f"docker could not start the session holder in {container!r}: {error.explanation}") from None
    except ENGINE_ERRORS as error:
        raise BackendError(f"the engine failed while starting the session holder: {error}") from None
    if text.startswith("error "):
        raise SpawnError(text.removeprefix("error ").strip())
    if not text.startswith("holder "):
        # The engine's own refusal (a working directory not in the container, ...) comes as the exec's output.
        # Docker keeps the pid of every exec that started: none is proof that nothing ran.
        info = await exec_state(api, created["Id"])
        if info and not info.get("Pid") and not info.get("Running"):
            raise SpawnError(f"docker refused to start the shell: {text.strip() or 'no answer'}")
    started = parse_started(text)
    handle = replace(handle, holder=replace(handle.holder, pid=started.holder_pid, program=started.pid))
    return await attach_held(api, handle)


async def attach_held(api: docker.APIClient, handle: DockerHandle, since: int = 0) -> HeldProcess:
    holder, container = handle.holder, handle.container

    async def connect(since: int):
        try:
            created = await asyncio.to_thread(
                api.exec_create, container, [holder.binary, "attach", holder.dir], stdin=True, tty=False
            )
            conn = await asyncio.to_thread(api.exec_start, created["Id"], tty=False, socket=True)
        except NotFound:
            raise BackendError(f"container {container!r} is gone") from None
        except (APIError, *ENGINE_ERRORS) as error:
            raise BackendError(f"cannot reach the session holder in {container!r}: {error}") from None
        link = RelayLink(DockerProcess(api, DockerHandle(exec_id=created["Id"], container=container), conn))
        try:
            session = Session(link)
            return session, await session.attach(holder.secret, since, screens=bool(holder.screens))
        except BaseException:
            await link.close()
            raise

    session, attached = await connect(since)

    async def read_record() -> Exit | None:
        state = await status(api, handle)
        return parse_record(state.removeprefix("exit ")) if state.startswith("exit ") else None

    async def end(grace: float) -> None:
        # What left the program's session still carries the marker: ended from inside the container.
        await end_tree(api, DockerHandle(container=container, marker=handle.marker), grace)

    async def forget() -> None:
        with contextlib.suppress(BackendError, *ENGINE_ERRORS):
            await _run(api, container, [holder.binary, "forget", holder.dir])

    async def alive() -> bool:
        try:
            return (await status(api, handle)).startswith("running")
        except (BackendError, *ENGINE_ERRORS):
            return True  # not known to be gone

    return HeldProcess(
        handle, session, attached, reconnect=connect, read_record=read_record, end_tree=end, forget=forget,
        holder_alive=alive,
    )  # fmt: skip


class RelayLink:
    """The holder's relay exec as a byte stream (docker's framing undone by ``_split``). Its stdout is the
    holder's frames; its stderr, the relay's complaint when no holder answers, ends the link with that text."""

    def __init__(self, process: DockerProcess):
        self.process = process
        self.pending = bytearray()

    async def read(self) -> bytes:
        """Every whole piece of stdout that has arrived (at least one), run together; b"" at the end."""
        while True:
            data, complaint, taken = _split(self.pending)
            if complaint:
                raise BackendError(f"the holder's relay: {complaint.decode(errors='replace').strip()}")
            if taken:
                del self.pending[:taken]
                if data:
                    return data
            chunk = await self.process.read()
            if not chunk:
                return b""
            self.pending += chunk

    async def write(self, data: bytes) -> None:
        await self.process.write(data)

    async def close(self) -> None:
        await self.process.detach()


async def status(api: docker.APIClient, handle: DockerHandle) -> str:
    """The holder's own account (``tether-holder status``): "exit RECORD", "running ...", "gone" or "none";
    for a stopped container, its exit record read from the filesystem ("gone" without one)."""
    holder, container = handle.holder, handle.container
    try:
        return (await _run(api, container, [holder.binary, "status", holder.dir])).strip()
    except NotFound:
        # The exec may have vanished (dockerd restarting) while the container and its shell run on: only
        # the container's own absence says the holder went with it.
        try:
            await asyncio.to_thread(api.inspect_container, container)
        except NotFound:
            return "container-gone"
        raise BackendError(
            f"the session holder's status in {container!r} could not be read (its exec vanished)"
        ) from None
    except APIError as error:
        if "is not running" not in str(error.explanation):
            raise BackendError(f"cannot ask the session holder in {container!r}: {error.explanation}") from None
    record = await asyncio.to_thread(_read_archive, api, container, f"{holder.dir}/exit")
    return f"exit {record.decode(errors='replace')}" if record else "gone"


async def inspect_held(api: docker.APIClient, handle: DockerHandle) -> Inspection:
    try:
        state = await status(api, handle)
    except ENGINE_ERRORS as error:
        return Inspection(Status.UNKNOWN, detail=str(error))
    except BackendError as error:
        return Inspection(Status.UNKNOWN, detail=str(error))
    where = f"in {handle.container!r}"
    if state.startswith("running"):
        return Inspection(Status.ALIVE, detail=f"held by its session holder {where}", held=True)
    if state.startswith("exit ") and (exit := parse_record(state.removeprefix("exit "))) is not None:
        kept = "held=1" in state.split()  # its holder lives on, keeping the last output for a client
        detail = f"the session holder {where} recorded: {exit.describe()}{'; it keeps the last output' if kept else ''}"
        return Inspection(Status.EXITED, exit=exit, detail=detail, held=kept)
    if state == "container-gone":
        return Inspection(Status.GONE, detail=f"container {handle.container!r} is gone, and its holder with it")
    if state == "none" and handle.launch == Launch.STARTING and (serve := handle.exec_id):
        # Its serve exec was created; nothing is there: was it ever started? Docker remembers.
        info = await exec_state(api, serve)
        if info and not info.get("Pid") and not info.get("Running") and info.get("ExitCode") is None:
            return Inspection(
                Status.NEVER_STARTED, detail=f"the holder's exec {serve[:12]} was created but never started"
            )
    if state not in ("gone", "none"):  # a cut or garbled answer says nothing about the holder
        return Inspection(Status.UNKNOWN, detail=f"the session holder {where} gave no answer to go by ({state[:80]!r})")
    return Inspection(Status.GONE, detail=f"the session holder {where} is gone and left no exit record")


async def remove_held(api: docker.APIClient, handle: DockerHandle, grace: float) -> None:
    """End a held program found through its handle (no owner holds it), then let its holder go."""
    with contextlib.suppress(BackendError, TimeoutError):
        said = await status(api, handle)
        # Running, or its program ended and its holder still keeps the exit for an owner: attached and let go.
        if said.startswith("running") or "held=1" in said.split():
            process = await attach_held(api, handle)
            await process.terminate(grace=grace)
            await process.release()
            return
    await end_tree(api, DockerHandle(container=handle.container, marker=handle.marker), grace)
