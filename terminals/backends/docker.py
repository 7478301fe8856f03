"""The docker backend: each program is a TTY ``docker exec`` in an existing container.

The docker SDK is synchronous, so its calls run in threads; the exec's hijacked
stream is read and written as a non-blocking socket on the event loop, so a
thousand open terminals need no thread each.

Docker has no API to signal an exec. When dockerd runs on this host its exec
processes are visible in /proc, so the tree is ended from here (pid + start time,
session, marker variable); otherwise a small sh script run by a separate exec
ends it from inside the container (``docker_tree``).

What docker 20.10 does when the client's socket goes away (tested): the exec keeps
running with its terminal and its output is discarded, unless dockerd was blocked
writing to the client at that moment; then the exec is recorded as ended with code
126 and its terminal is hung up (SIGHUP) while processes ignoring SIGHUP go on,
unseen by ``exec inspect``. Docker writes that 126 whenever the attach ends in an
error, even over a program that had already exited, and most dropped trees die of
the hang-up. So a 126 is the program's exit only for the owner that read the
stream to its end itself (and once none of the exec's processes is left); read
back by anyone else it is an unknown outcome. Docker also reports a death by
signal N as 128+N, which a program can exit with too: such codes are recorded as
an ambiguous exit status. A dropped exec cannot be attached again, so an owner
giving one up calls ``abandon()``, and a dead owner's leftovers need ``remove()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import replace
from pathlib import Path

import docker
from docker.errors import APIError, NotFound

from terminals.backends import procfs
from terminals.backends.base import (
    Backend,
    BackendError,
    BeforeStart,
    Inspection,
    Process,
    SpawnError,
    SpawnSpec,
    Status,
    Tags,
    child_env,
)
from terminals.backends.docker_exec import (
    DROPPED_CODE,
    ENGINE_ERRORS,
    doubt,
    end_tree,
    exec_state,
    exit_of,
    failed_start,
    host_identity,
    resize_when_started,
    settled,
    started,
    survivors,
)
from terminals.backends.docker_held import (
    Unheld,
    attach_held,
    inspect_held,
    install,
    place,
    remove_held,
    spawn_held,
)
from terminals.backends.docker_process import DockerProcess
from terminals.backends.handles import DockerHandle, Launch
from terminals.backends.holder import holder_binary, mux_program

log = logging.getLogger(__name__)

_BUILT = object()


async def _our_process(pid: int, marker: str) -> procfs.ProcessIdentity | None:
    """The exec's process in our /proc once it shows our marker (runc's init holds the pid until its execve)."""
    deadline = time.monotonic() + 2
    while (identity := procfs.ProcessIdentity.of(pid)) is not None and identity.is_alive():
        if procfs._has_marker(pid, marker):
            return identity
        if time.monotonic() > deadline:
            return None
        await asyncio.sleep(0.01)
    return None


def engine_client(engine: str, timeout: float) -> docker.APIClient:
    """A client of the docker engine at ``engine`` (a URL; "" for the local one, as the environment says)."""
    if engine:
        return docker.APIClient(base_url=engine, version="auto", timeout=timeout)
    return docker.APIClient(version="auto", timeout=timeout, **docker.utils.kwargs_from_env())


class DockerBackend(Backend):
    name = "docker"

    def __init__(self, container: str, engine: str = "", timeout: float = 30.0, holder=_BUILT):
        self.container = container
        self.engine = engine
        self.timeout = timeout
        self._clients: dict[str, docker.APIClient] = {}
        # The holder binary copied into containers to hold their shells, or None: plain execs (they end
        # with their worker).
        self.holder = holder_binary() if holder is _BUILT else holder

    def _where(self, engine: str) -> str:
        return f"docker engine {engine}" if engine else "the local docker engine"

    async def _client(self, engine: str) -> docker.APIClient:
        if engine not in self._clients:
            try:
                self._clients[engine] = await asyncio.to_thread(engine_client, engine, self.timeout)
            except ENGINE_ERRORS as error:
                raise BackendError(f"{self._where(engine)} is unreachable: {error}") from None
        return self._clients[engine]

    @contextlib.contextmanager
    def _spawn_errors(self, program: str):
        """Docker's refusals as SpawnError: nothing was started."""
        try:
            yield
        except NotFound as error:
            raise SpawnError(f"container {self.container!r} not found on {self._where(self.engine)}") from error
        except APIError as error:
            raise SpawnError(f"docker could not start {program!r} in {self.container!r}: {error.explanation}") from None
        except ENGINE_ERRORS as error:
            raise SpawnError(f"{self._where(self.engine)} failed to start an exec: {error}") from None

    async def spawn(
        self, spec: SpawnSpec, tags: Tags, before_start: BeforeStart | None = None, instance: str = ""
    ) -> Process:
        """``instance`` (as ``instance()`` gave it when the worker recorded where it runs) pins the container by
        id: one re-created under the name meanwhile is another machine, and its exec would run there. With
        the holder, the program is the holder's (``docker_held``); where it cannot run, a plain exec."""
        try:
            api = await self._client(self.engine)
        except BackendError as error:
            raise SpawnError(str(error)) from None
        env = child_env(spec, tags)
        if "PATH" not in spec.env:
            env.pop("PATH")  # the image's own PATH is the one its programs expect
        program = spec.argv[0]
        container = instance.rpartition("/")[2] or self.container
        unheld = ""
        if self.holder is not None:
            try:
                engine_id = instance.rpartition("/")[0] or await self._daemon(api)
                with self._spawn_errors(program):
                    return await spawn_held(
                        api, self.engine, engine_id, container, self.holder, spec, tags, env, before_start
                    )
            except Unheld as why:
                log.warning("container %s: %s; its shells end with their worker", container, why)
                unheld = str(why)
        with self._spawn_errors(program):
            created = await asyncio.to_thread(
                api.exec_create, container, list(spec.argv), stdin=True, tty=True,
                environment=env, workdir=spec.cwd or None,
            )  # fmt: skip
        handle = DockerHandle(
            engine=self.engine, container=container, exec_id=created["Id"], marker=tags.marker, session=tags.session,
            owner_pid=tags.owner_pid, owner_started_at=tags.owner_started_at,
            unheld=unheld or None,  # said on the page and in the admin: this shell ends with its worker
        )  # fmt: skip
        if before_start is not None:
            # Kept before it can run: an exec that is created but never started is proof nothing ran.
            await before_start(handle)
        try:
            conn = await asyncio.to_thread(api.exec_start, created["Id"], tty=True, socket=True)
        except (APIError, *ENGINE_ERRORS) as error:
            await failed_start(api, created["Id"], f"{program!r} in {self.container!r}", error)
        process = DockerProcess(api, handle, conn)
        try:
            info = await started(api, created["Id"])
            if not info["Pid"]:
                # Nothing started; docker wrote runc's reason (missing program or directory) into the stream.
                reason = "no reason given"
                with contextlib.suppress(TimeoutError):
                    reason = (await asyncio.wait_for(process.read(), 2)).decode(errors="replace").strip()
                raise SpawnError(f"could not start {program!r} in {self.container!r}: {reason}")
            if api.base_url == "http+docker://localhost" and (identity := await _our_process(info["Pid"], tags.marker)):
                process.handle = replace(handle, process=identity)  # dockerd shares our /proc: signal from here
            if info["Running"]:
                await resize_when_started(api, created["Id"], spec.cols, spec.rows)
        except BaseException:
            # SpawnError: nothing ran. Anything else: it may have; it is ended here, and the error (no
            # SpawnError) has the worker record the outcome unknown.
            with contextlib.suppress(Exception):
                await process.terminate(grace=0)
            raise
        return process

    async def attach(self, handle: DockerHandle) -> Process:
        if handle.holder is None:
            return await super().attach(handle)
        return await attach_held(await self._client(handle.engine), handle)

    async def inspect(self, handle: DockerHandle) -> Inspection:
        if handle.holder is not None:
            try:
                api = await self._client(handle.engine)
            except BackendError as error:
                return Inspection(Status.UNKNOWN, detail=str(error))
            return await inspect_held(api, handle)
        try:
            api = await self._client(handle.engine)
            info = await exec_state(api, handle.exec_id)
            if not info:
                try:
                    await asyncio.to_thread(api.inspect_container, handle.container)
                except NotFound:
                    return Inspection(Status.GONE, detail=f"container {handle.container!r} is gone")
                return Inspection(Status.GONE, detail="docker no longer knows the exec (daemon restarted?)")
        except (BackendError, *ENGINE_ERRORS) as error:
            return Inspection(Status.UNKNOWN, detail=str(error))
        if info["Running"]:
            return Inspection(Status.ALIVE, detail=f"exec {handle.exec_id[:12]} is running")
        identity = host_identity(handle)
        if identity is not None and identity.is_alive():
            # Docker stops tracking an exec whose client vanished mid-write; its process may well go on.
            return Inspection(
                Status.ALIVE, detail=f"docker says ended ({info['ExitCode']}) but pid {identity.pid} runs"
            )
        if info["ExitCode"] is None and not info.get("Pid") and handle.launch == Launch.STARTING:
            # Created, never started, and only its owner (dead, for whoever looks from outside) starts it.
            return Inspection(Status.NEVER_STARTED, detail=f"exec {handle.exec_id[:12]} was created but never started")
        if info["ExitCode"] is None:
            return Inspection(Status.UNKNOWN, detail="docker says the exec is not running but records no exit code")
        try:
            if doubted := await doubt(api, handle, info["ExitCode"]):
                return Inspection(Status.ALIVE, detail=doubted)
        except BackendError as error:
            return Inspection(Status.UNKNOWN, detail=f"docker says {info['ExitCode']}, but: {error}")
        if info["ExitCode"] == DROPPED_CODE:
            # Looked at from outside, nobody saw the stream end: "nothing of it left running" is exactly what
            # a dropped exec looks like once its hung-up terminal has ended the tree.
            return Inspection(
                Status.GONE,
                detail=f"docker records {DROPPED_CODE}, which it writes itself when it drops an exec whose client "
                "went away: the program's own exit is unknown",
            )
        return Inspection(Status.EXITED, exit=exit_of(info["ExitCode"]))

    async def inspect_launch(self, intent: DockerHandle) -> Inspection:
        if intent.holder is not None:  # its serve exec may have run: the holder tells
            return await self.inspect(intent)
        if not intent.exec_id:
            # The exec is started only once its id is kept, by a fenced write: without one, nothing was started,
            # and an owner that wakes now finds its lease taken before it can start one.
            return Inspection(Status.NEVER_STARTED, detail="its owner stopped before it created the exec", fenced=True)
        return await self.inspect(intent)

    async def _daemon(self, api: docker.APIClient) -> str:
        """The engine's own id: the same name on another engine (another host's local socket) is another thing."""
        try:
            return (await asyncio.to_thread(api.info))["ID"]
        except ENGINE_ERRORS as error:
            raise BackendError(f"{self._where(self.engine)} is unreachable: {error}") from None

    async def _container(self, api: docker.APIClient, container: str) -> dict | None:
        """The container as docker inspects it (by id or name), None when there is none."""
        try:
            return await asyncio.to_thread(api.inspect_container, container)
        except NotFound:
            return None
        except ENGINE_ERRORS as error:
            raise BackendError(f"cannot inspect container {container!r}: {error}") from None

    async def place_file(self, source: Path, instance: str = "") -> str:
        """Copied into the container (``/tmp/.tether``, checked by its digest), as the holder is."""
        if source.is_dir():
            raise BackendError(f"{source.name}: a directory of startup files is not copied into containers yet")
        api = await self._client(self.engine)
        engine_id, _, container = instance.rpartition("/")
        try:
            return await place(
                api,
                engine_id or await self._daemon(api),
                container or self.container,
                source,
                "rc",
                "the shell integration",
            )
        except Unheld as why:
            raise BackendError(str(why)) from None

    async def pipes_program(self, instance: str = "") -> str:
        """The holder copied into the container (as for a held shell)."""
        binary = Path(mux_program())
        api = await self._client(self.engine)
        engine_id, _, container = instance.rpartition("/")
        try:
            return await install(api, engine_id or await self._daemon(api), container or self.container, binary)
        except Unheld as why:
            raise BackendError(f"a command on pipes (pty: false) cannot run in this container: {why}") from None

    async def instance(self, *, ensure: bool = False) -> str:
        """``ENGINE-ID/CONTAINER-ID`` of the machine's container now, "" when there is none by its name."""
        api = await self._client(self.engine)
        found = await self._container(api, self.container)
        return f"{await self._daemon(api)}/{found['Id']}" if found else ""

    async def vacancy(self, instance: str) -> str | None:
        api = await self._client(self.engine)
        daemon, _, container = instance.rpartition("/")
        if daemon and daemon != (here := await self._daemon(api)):
            raise BackendError(
                f"{self._where(self.engine)} is docker engine {here[:12]}, not {daemon[:12]} where it ran: "
                "look from a host and DOCKER_HOST that reach that engine"
            )
        # By the id it ran in: a container re-created under the name leaves the old one's fate open.
        found = await self._container(api, container or self.container)
        shown = (container or self.container)[:12]
        if found is None:
            return f"container {shown} no longer exists: every process of it ended with it"
        if not found["State"]["Running"]:
            return f"container {shown} is stopped ({found['State']['Status']}): none of its processes runs"
        return None

    async def survivors(self, handle: DockerHandle) -> int:
        api = await self._client(handle.engine if handle.engine is not None else self.engine)
        return await survivors(api, handle if handle.container else replace(handle, container=self.container))

    async def remove(self, handle: DockerHandle, grace: float = 2.0) -> None:
        api = await self._client(handle.engine)
        if handle.holder is not None:
            await remove_held(api, handle, grace)
            return
        await end_tree(api, handle, grace)
        await settled(api, handle.exec_id)
