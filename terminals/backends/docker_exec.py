"""One docker exec as its engine tells it: its recorded state, its process tree, and whether a recorded exit
code is the program's own (see terminals.backends.docker for what docker does when a stream drops)."""

from __future__ import annotations

import asyncio
import logging
import time

import docker
import requests
from docker.errors import APIError, DockerException, NotFound

from executions.outcomes import AMBIGUOUS_STATUSES
from terminals.backends import ending, procfs
from terminals.backends.base import BackendError, Exit, SpawnError
from terminals.backends.docker_tree import run_tree_script
from terminals.backends.handles import DockerHandle

log = logging.getLogger(__name__)

SOURCE = "docker exec inspect"
LAST_OUTPUT_LIMIT = 8 * 1024 * 1024  # what the terminal and dockerd still buffer once the tree is gone
ENGINE_ERRORS = (DockerException, requests.RequestException)
DROPPED_CODE = 126  # a program's exit code, and what docker records when it drops an exec (see the module doc)


def exit_of(code: int) -> Exit:
    """Docker's exit code as an Exit: 128+N may be the program's exit or its death by signal N."""
    return Exit(code=code, source=SOURCE, ambiguous=code in AMBIGUOUS_STATUSES)


def host_identity(handle: DockerHandle) -> procfs.ProcessIdentity | None:
    """The exec's process as seen in this host's /proc, if it was seen there at spawn and this is the same boot."""
    identity = handle.process
    return identity if identity is not None and identity.boot_id == procfs.boot_id() else None


async def exec_state(api: docker.APIClient, exec_id: str) -> dict:
    """exec inspect's answer; {} when docker no longer knows the exec."""
    try:
        return await asyncio.to_thread(api.exec_inspect, exec_id)
    except NotFound:
        return {}
    except ENGINE_ERRORS as error:
        raise BackendError(f"cannot inspect exec {exec_id[:12]}: {error}") from None


async def settled(api: docker.APIClient, exec_id: str, timeout: float = 10.0) -> dict:
    """exec inspect once it no longer says running ({} if the exec is unknown)."""
    deadline = time.monotonic() + timeout
    while (info := await exec_state(api, exec_id)).get("Running"):
        if time.monotonic() > deadline:
            raise BackendError(f"exec {exec_id[:12]} still running {timeout}s after its tree was ended")
        await asyncio.sleep(0.05)
    return info


async def end_tree(api: docker.APIClient, handle: DockerHandle, grace: float) -> None:
    """End the exec's process and every process of its tree; return once none is left."""
    identity = host_identity(handle)
    if identity is not None:
        # Our /proc shows the container's processes: the exec leads its own session there.
        await ending.terminate_tree(marker=handle.marker, leader=identity, grace=grace)
        return
    container = handle.container
    if left := await run_tree_script(api, container, handle.marker, "HUP TERM", grace):
        raise BackendError(f"{left} process(es) still alive in {container!r} after SIGKILL")


async def doubt(api: docker.APIClient, handle: DockerHandle, code: int, settle: float = 0.0) -> str:
    """Why docker's recorded exit code is not the program's exit, or "" when nothing says otherwise.

    Docker records 126 for an exec whose client went away while docker was writing to it, and hangs
    up its terminal; processes that ignore SIGHUP go on. So a 126 is believed only once no process
    of the exec's tree is left, given up to ``settle`` seconds for hung-up ones to finish dying.
    """
    if code != DROPPED_CODE:
        return ""
    deadline = time.monotonic() + settle
    while left := await survivors(api, handle):
        if time.monotonic() >= deadline:
            return (
                f"docker records {code} for exec {handle.exec_id[:12]}, as it does when it drops an"
                f" exec whose client went away, but {left} of its processes still run"
            )
        await asyncio.sleep(0.2)
    return ""


async def survivors(api: docker.APIClient, handle: DockerHandle) -> int:
    """How many processes of the exec's tree are alive, where docker says the exec has ended."""
    identity = host_identity(handle)
    if identity is not None:
        return len(await asyncio.to_thread(procfs.find_tree, marker=handle.marker, leader=identity))
    return await run_tree_script(api, handle.container, handle.marker, "0")


# --- starting one -------------------------------------------------------------------------------------


async def failed_start(api: docker.APIClient, exec_id: str, what: str, error: Exception) -> None:
    """exec_start failed: a refusal proves nothing started only if the exec is still unstarted; a broken
    connection or a timeout may have come after docker started it."""
    try:
        info = await exec_state(api, exec_id)
    except BackendError:
        info = None
    explanation = getattr(error, "explanation", None) or error
    if info is not None and not info.get("Pid") and not info.get("Running") and info.get("ExitCode") is None:
        raise SpawnError(f"docker could not start {what}: {explanation}") from None
    raise BackendError(f"docker failed while starting exec {exec_id[:12]}, which may have started: {explanation}")


async def started(api: docker.APIClient, exec_id: str, timeout: float = 10.0) -> dict:
    """exec inspect once the exec has a pid or an exit code (Pid stays 0 if it could not start)."""
    deadline = time.monotonic() + timeout
    # Docker answers the start request before it marks the exec running: not running, no code, no pid yet.
    while (info := await exec_state(api, exec_id)) and not info["Pid"] and info["ExitCode"] is None:
        if time.monotonic() > deadline:  # asked to start: it may yet, so this is no proof it did not
            raise BackendError(f"exec {exec_id[:12]} did not start within {timeout}s")
        await asyncio.sleep(0.01)
    if not info:
        raise SpawnError(f"exec {exec_id[:12]} vanished at start (container removed?)")
    return info


async def resize_when_started(api: docker.APIClient, exec_id: str, cols: int, rows: int) -> None:
    """Docker fails to resize an exec that is not ready yet (20.10: after 10s); retry with a short backoff."""
    delay, deadline = 0.01, time.monotonic() + 5
    while True:
        try:
            await asyncio.to_thread(api.exec_resize, exec_id, height=rows, width=cols)
            return
        except APIError as error:
            if not (await exec_state(api, exec_id)).get("Running"):
                return  # already over: there is no terminal left to size
            if time.monotonic() > deadline:  # it runs at another size: worse than it should be, not fatal
                log.warning("docker would not set exec %s's terminal size: %s", exec_id[:12], error.explanation)
                return
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.2)
