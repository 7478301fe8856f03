"""Backends under test, each against the real thing: a PTY, a tmux server, a dockerd container."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from terminals.backends.base import Backend, Tags
from terminals.backends.procfs import ProcessIdentity, find_tree, session_of
from terminals.backends.tmux_shim import SHIM_MARKER_VARIABLE

# "local" and "docker" are held shells (the session holder owns the PTY); "local-plain" the worker's own
# PTY and "docker-plain" a bare exec, what a machine gets where the holder cannot run.
BACKENDS = ["local", "local-plain", "tmux", "docker", "docker-plain"]


def make_tags(session: str | None = None) -> Tags:
    me = ProcessIdentity.of(os.getpid())
    return Tags(session=session or f"test-{uuid.uuid4().hex[:8]}", owner_pid=me.pid, owner_started_at=me.start_time)


@pytest.fixture(params=BACKENDS)
def backend_name(request) -> str:
    return request.param


@pytest.fixture
def make_backend(backend_name, request) -> Callable[[], Backend]:
    """Build a backend of the parametrised kind; another call gives another instance on the same place."""
    if backend_name.startswith("local"):
        from terminals.backends.holder import holder_binary
        from terminals.backends.local import LocalBackend

        if backend_name == "local-plain":
            return lambda: LocalBackend(holder=None)
        assert holder_binary() is not None, "the session holder is not built: make holder"
        return LocalBackend
    if backend_name == "tmux":
        from terminals.backends.tmux import TmuxBackend

        socket = request.getfixturevalue("tmux_socket")
        return lambda: TmuxBackend(socket=socket)
    from terminals.backends.docker import DockerBackend

    name = request.getfixturevalue("container")
    if backend_name == "docker-plain":
        return lambda: DockerBackend(container=name, holder=None)
    return lambda: DockerBackend(container=name)


@pytest.fixture
def backend(make_backend) -> Backend:
    return make_backend()


@pytest.fixture
def read_place_file(backend_name, request) -> Callable[[str], str | None]:
    """Read a file where the backend's processes run (the host, or inside the container)."""
    if not backend_name.startswith("docker"):

        def read_host(path: str) -> str | None:
            try:
                with open(path) as handle:
                    return handle.read()
            except FileNotFoundError:
                return None

        return read_host
    name = request.getfixturevalue("container")

    def read_container(path: str) -> str | None:
        result = subprocess.run(["docker", "exec", name, "cat", path], capture_output=True, text=True)
        return result.stdout if result.returncode == 0 else None

    return read_container


def left_behind(marker: str) -> list[ProcessIdentity]:
    """Every live process of a spawn on this host: the program's tree and, for tmux, the pane's shim."""
    return find_tree(marker=marker) + find_tree(marker=marker, variable=SHIM_MARKER_VARIABLE)


def _stat(pid: int) -> list[str]:
    raw = Path(f"/proc/{pid}/stat").read_text()
    return raw[raw.rindex(")") + 2 :].split()


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


@pytest.fixture
def output_relays(backend_name, request) -> Callable[[], dict[str, int]]:
    """The processes on this host that pass a program's output on to us (a local PTY has none but the
    kernel): the tmux server, or dockerd and the container's containerd-shim. Call it after spawn."""
    if backend_name == "local-plain":
        return dict
    if backend_name == "local":

        def holder() -> dict[str, int]:  # this run's newest holder: the one the spawn just started
            holders = []
            ours = f"tether-holder\0serve\0{os.environ['TETHER_HOLDER_DIR']}/".encode()  # tests/conftest.py
            for entry in Path("/proc").iterdir():
                try:
                    if entry.name.isdigit() and ours in (entry / "cmdline").read_bytes():
                        holders.append((int(_stat(int(entry.name))[19]), int(entry.name)))
                except OSError:
                    continue
            return {"session holder": max(holders)[1]} if holders else {}

        return holder
    if backend_name == "tmux":
        socket = request.getfixturevalue("tmux_socket")

        def tmux_server() -> dict[str, int]:
            pid = subprocess.run(["tmux", "-L", socket, "display", "-p", "#{pid}"], capture_output=True, text=True)
            return {"tmux server": int(pid.stdout)}

        return tmux_server
    container = request.getfixturevalue("container")

    def engine() -> dict[str, int]:
        inspect = ["docker", "inspect", "-f", "{{.State.Pid}}", container]
        main = int(subprocess.run(inspect, capture_output=True, text=True, check=True).stdout)
        shim = int(_stat(main)[1])  # the container's main process is a child of its shim
        assert _comm(shim).startswith("containerd-shim"), _comm(shim)
        (dockerd,) = [
            int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _comm(int(p.name)) == "dockerd"
        ]
        return {"dockerd": dockerd, "containerd-shim": shim}

    return engine


def wait_until(predicate: Callable[[], object], timeout: float = 10.0, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s")


def session_leader(*argv: str) -> subprocess.Popen:
    """``argv`` run by ``setsid``, as a stranger's own session (Popen's child is no group leader, so setsid
    does not fork: the pid leads the session)."""
    return subprocess.Popen(["setsid", *argv], stdout=subprocess.PIPE, text=True)


@pytest.fixture
def stranger():
    """An unrelated live process leading its own session: what a reused pid may name."""
    leader = session_leader("sleep", "1000")
    try:
        wait_until(lambda: session_of(leader.pid) == leader.pid)
        yield ProcessIdentity.of(leader.pid)
    finally:
        leader.kill()
        leader.wait()


MAIN = "sleep 2147483647"  # the container's own process; everything else was exec'd


def exec_processes(container: str) -> list[str]:
    """Every process in the container except its main one, as `docker top` lists them."""
    top = subprocess.run(
        ["docker", "top", container, "-eo", "pid,args"], capture_output=True, text=True, check=True, timeout=30
    )
    return [line for line in top.stdout.splitlines()[1:] if not line.strip().endswith(MAIN)]


async def settled_exec_processes(container: str, timeout: float = 5.0) -> list[str]:
    """exec_processes once no transient one is left; the last listing if some stay."""
    left = exec_processes(container)
    for _ in range(int(timeout / 0.1)):
        if not left:
            break
        await asyncio.sleep(0.1)
        left = exec_processes(container)
    return left
