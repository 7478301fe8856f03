"""The docker exec backend against a real dockerd: what is left behind, and what another process can see. These
are a plain exec's properties (no session holder: what a container gets where the holder cannot run); held
docker shells are tested in test_holder.py."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import docker
import pytest

from executions.actions import Actor, add_machine
from executions.models import Machine
from terminals.backends import docker_process
from terminals.backends.base import BackendError, Exit, SpawnError, SpawnSpec, Status
from terminals.backends.docker import DockerBackend as HeldOrPlain
from terminals.backends.handles import DockerHandle, load
from terminals.backends.procfs import find_tree
from terminals.registry import backend_for
from tests.backends.conftest import exec_processes, make_tags, settled_exec_processes, wait_until
from tests.backends.test_contract import read_until, shell

REPO = Path(__file__).resolve().parents[2]


def DockerBackend(**kwargs) -> HeldOrPlain:
    return HeldOrPlain(holder=None, **kwargs)


# A shell with a child that ignores HUP and TERM, and a detached grandchild in its own session.
STUBBORN = (
    "(trap '' HUP TERM; while :; do sleep 0.1; done) & setsid sh -c 'trap \"\" HUP TERM; while :; do sleep 0.1; done' &"
    " echo ready",
    "sleep 1000",
)


async def test_terminate_leaves_no_exec_process_in_the_container(container):
    tags = make_tags()
    process = await DockerBackend(container=container).spawn(shell(*STUBBORN), tags)
    await read_until(process, b"ready")
    seen = 0  # the shell, its child, the detached grandchild and `sleep 1000` (plus a passing `sleep 0.1`)
    for _ in range(50):
        seen = max(seen, len(exec_processes(container)))  # a second listing may miss the short-lived sleep
        if seen >= 4:
            break
        await asyncio.sleep(0.1)
    assert seen >= 4
    exit = await asyncio.wait_for(process.terminate(grace=0.3), 30)
    assert exit is not None and exit.source == "docker exec inspect"
    assert await settled_exec_processes(container) == []
    assert find_tree(marker=tags.marker) == []
    assert (await DockerBackend(container=container).inspect(process.handle)).status == Status.EXITED


async def test_last_words_stay_readable_after_terminate(container):
    backend = DockerBackend(container=container)
    script = "trap 'echo goodbye-$((6*7)); exit 3' HUP TERM; echo ready; while :; do sleep 0.1; done"
    process = await backend.spawn(shell(script), make_tags())
    await read_until(process, b"ready")
    assert await asyncio.wait_for(process.terminate(grace=2), 30) == Exit(code=3, source="docker exec inspect")
    await read_until(process, b"goodbye-42")
    assert await process.read() == b""


async def test_terminating_a_stalled_stream_keeps_the_real_exit_code(container):
    """Docker replaces a recorded exit code with 126 if the stream goes while it still writes to us."""
    backend = DockerBackend(container=container)
    process = await backend.spawn(shell("while :; do echo xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx; done"), make_tags())
    await read_until(process, b"xxxx")
    await asyncio.sleep(1)  # nobody reads: dockerd blocks writing to us
    exit = await asyncio.wait_for(process.terminate(grace=0.3), 30)
    assert exit.code in {128 + signal.SIGHUP, 128 + signal.SIGTERM, 128 + signal.SIGKILL}
    await asyncio.sleep(0.5)
    assert (await DockerBackend(container=container).inspect(process.handle)).exit == exit


async def test_terminate_from_inside_the_container_when_host_pids_are_not_ours(container):
    """The path for a remote engine: no host pid in the handle, so a separate exec ends the tree."""
    tags = make_tags()
    process = await DockerBackend(container=container).spawn(shell(*STUBBORN), tags)
    await read_until(process, b"ready")
    process.handle = replace(process.handle, process=None)
    await asyncio.wait_for(process.terminate(grace=0.3), 30)
    assert await settled_exec_processes(container) == []
    assert find_tree(marker=tags.marker) == []


async def test_a_stale_host_pid_never_ends_a_strangers_session(container, stranger):
    """The handle's host pid now names an unrelated session leader (pid reused): the exec's tree is still
    ended by its marker, and the stranger is left alone."""
    tags = make_tags()
    process = await DockerBackend(container=container).spawn(shell(*STUBBORN), tags)
    await read_until(process, b"ready")
    await process.detach()
    forged = replace(process.handle, process=replace(stranger, start_time=stranger.start_time + 1))
    await asyncio.wait_for(DockerBackend(container=container).remove(forged, grace=0.3), 30)
    assert stranger.is_alive()
    assert await settled_exec_processes(container) == []
    assert find_tree(marker=tags.marker) == []


async def test_a_dropped_stream_keeps_the_program_running_until_it_is_removed(container):
    """Docker 20.10 neither signals nor stops a TTY exec whose client went away: we must end it."""
    tags = make_tags()
    backend = DockerBackend(container=container)
    process = await backend.spawn(shell("echo ready; while :; do echo tick; sleep 0.1; done"), tags)
    await read_until(process, b"ready")
    await process.detach()
    await asyncio.sleep(1)
    assert (await backend.inspect(process.handle)).status == Status.ALIVE
    assert exec_processes(container), "docker ended the exec when its stream was dropped"
    await DockerBackend(container=container).remove(process.handle, grace=0.3)
    assert await settled_exec_processes(container) == []
    assert find_tree(marker=tags.marker) == []


async def test_abandon_leaves_nothing_behind(container):
    tags = make_tags()
    process = await DockerBackend(container=container).spawn(shell(*STUBBORN), tags)
    await read_until(process, b"ready")
    await asyncio.wait_for(process.abandon(grace=0.3), 30)
    assert await settled_exec_processes(container) == []
    assert find_tree(marker=tags.marker) == []


async def test_dropping_a_stalled_stream_fakes_an_exit_that_inspect_does_not_believe(container):
    """Docker records 126 and hangs up the terminal if it was blocked writing to us; a HUP-proof program goes on."""
    backend = DockerBackend(container=container)
    script = "trap '' HUP; while :; do echo xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx; done"
    process = await backend.spawn(shell(script), make_tags())
    await read_until(process, b"xxxx")
    await asyncio.sleep(1.5)  # nobody reads: the program and dockerd block in write
    await process.detach()
    await asyncio.sleep(0.5)
    said = docker.APIClient().exec_inspect(process.handle.exec_id)
    assert (said["Running"], said["ExitCode"]) == (False, 126)
    seen = await backend.inspect(process.handle)
    assert seen.status == Status.ALIVE, seen
    assert exec_processes(container)
    await backend.remove(process.handle, grace=0.3)
    assert await settled_exec_processes(container) == []
    # Nothing of it is left, which is exactly what a dropped exec looks like: docker's 126 is no exit.
    seen = await backend.inspect(process.handle)
    assert seen.status == Status.GONE and seen.exit is None, seen
    assert "126" in seen.detail and "unknown" in seen.detail


SPAWNER = """
import asyncio, json, sys, time
from terminals.backends.docker import DockerBackend
from terminals.backends import handles
from terminals.backends.base import SpawnSpec
from tests.backends.conftest import make_tags

async def main():
    backend = DockerBackend(container=sys.argv[1], holder=None)
    process = await backend.spawn(SpawnSpec(argv=tuple(sys.argv[2:])), make_tags())
    # Read what comes at first (a prompt), so docker has no write in flight to us when we are killed.
    try:
        while await asyncio.wait_for(process.read(), 0.5):
            pass
    except TimeoutError:
        pass
    print(json.dumps(handles.dump(process.handle)), flush=True)  # as a lease keeps it
    time.sleep(1000)  # hold the stream open until killed

asyncio.run(main())
"""


def spawn_in_other_process(container: str, *argv: str) -> tuple[subprocess.Popen, DockerHandle]:
    spawner = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(SPAWNER), container, *argv],
        cwd=REPO, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    line = spawner.stdout.readline()
    assert line, "the spawner printed no handle"
    return spawner, load(json.loads(line))


@pytest.mark.parametrize("script", ["sleep 3; exit 5", "sleep 3; echo done; exit 5"])
async def test_inspect_from_a_new_process_reads_the_exit_after_the_spawner_was_killed(container, script):
    spawner, handle = spawn_in_other_process(container, "/bin/sh", "-c", script)
    os.kill(spawner.pid, signal.SIGKILL)
    spawner.wait()
    observer = DockerBackend(container=container)
    assert (await observer.inspect(handle)).status == Status.ALIVE

    async def settled():
        while (seen := await observer.inspect(handle)).status == Status.ALIVE:
            await asyncio.sleep(0.1)
        return seen

    seen = await asyncio.wait_for(settled(), 10)
    assert seen.status == Status.EXITED
    assert seen.exit.code == 5 and seen.exit.source == "docker exec inspect"


async def test_a_killed_spawners_shell_is_found_and_removed_from_another_process(container):
    spawner, handle = spawn_in_other_process(container, "/bin/sh")
    os.kill(spawner.pid, signal.SIGKILL)
    spawner.wait()
    await asyncio.sleep(0.5)
    backend = DockerBackend(container=container)
    seen = await backend.inspect(handle)
    assert seen.status == Status.ALIVE, seen
    assert exec_processes(container)
    await backend.remove(handle, grace=0.3)
    assert await settled_exec_processes(container) == []
    assert (await backend.inspect(handle)).status == Status.EXITED


async def test_inspect_says_gone_once_the_container_is_removed(container):
    backend = DockerBackend(container=container)
    process = await backend.spawn(shell(), make_tags())
    subprocess.run(["docker", "rm", "-f", container], capture_output=True, check=True)
    seen = await backend.inspect(process.handle)
    assert seen.status == Status.GONE
    assert container in seen.detail
    with pytest.raises(BackendError, match="no longer knows"):
        await asyncio.wait_for(process.wait(), 10)
    await process.detach()


async def test_spawn_into_a_missing_container_says_so():
    with pytest.raises(SpawnError, match=r"container 'tether-test-nonexistent' not found on the local docker engine"):
        await DockerBackend(container="tether-test-nonexistent").spawn(shell(), make_tags())


@pytest.mark.parametrize(
    ("spec", "reason"),
    [(SpawnSpec(argv=("/no/such/program",)), "no such file"), (SpawnSpec(argv=("sh",), cwd="/no/dir"), "/no/dir")],
)
async def test_spawn_of_what_cannot_start_says_why(container, spec, reason):
    with pytest.raises(SpawnError, match=reason):
        await DockerBackend(container=container).spawn(spec, make_tags())
    assert await settled_exec_processes(container) == []


async def test_an_unreachable_engine_is_unknown_not_gone(container, tmp_path):
    backend = DockerBackend(container=container, engine=f"unix://{tmp_path}/no-docker.sock")
    with pytest.raises(SpawnError, match="unreachable"):
        await backend.spawn(shell(), make_tags())
    handle = DockerHandle(engine=backend.engine, container=container, exec_id="0" * 64, marker="m")
    assert (await backend.inspect(handle)).status == Status.UNKNOWN


LOCAL_ENGINE = "unix:///var/run/docker.sock"


async def test_an_explicit_engine_url_is_used_and_kept_in_the_handle(container):
    backend = DockerBackend(container=container, engine=LOCAL_ENGINE)
    process = await backend.spawn(shell("echo on-$((40+2)); read line; exit 5"), make_tags())
    assert process.handle.engine == LOCAL_ENGINE
    assert process.handle.process is not None  # a unix socket is this host's engine: its pids are ours to check
    await read_until(process, b"on-42")
    await process.write(b"go\n")
    assert (await asyncio.wait_for(process.wait(), 10)).code == 5
    seen = await DockerBackend(container=container, engine=LOCAL_ENGINE).inspect(process.handle)
    assert (seen.status, seen.exit.code) == (Status.EXITED, 5)


async def test_inspect_and_remove_follow_the_engine_named_in_the_handle(container, tmp_path):
    """A backend's engine is only where it spawns: a handle is looked at, and removed, on its own engine."""
    tags = make_tags()
    process = await DockerBackend(container=container, engine=LOCAL_ENGINE).spawn(shell(*STUBBORN), tags)
    await read_until(process, b"ready")
    await process.detach()
    elsewhere = DockerBackend(container=container, engine=f"unix://{tmp_path}/no-docker.sock")
    seen = await elsewhere.inspect(process.handle)
    assert seen.status == Status.ALIVE, seen
    # The same exec named on an unreachable engine is unknown, even to a backend whose own engine works.
    moved = replace(process.handle, engine=elsewhere.engine)
    assert (await DockerBackend(container=container, engine=LOCAL_ENGINE).inspect(moved)).status == Status.UNKNOWN
    await asyncio.wait_for(elsewhere.remove(process.handle, grace=0.3), 30)
    assert await settled_exec_processes(container) == []
    assert (await elsewhere.inspect(process.handle)).status == Status.EXITED


async def test_every_terminal_has_its_size_right_after_spawn(container):
    """The size is set once the exec runs; docker refuses earlier, so spawn retries until it takes."""
    backend = DockerBackend(container=container)
    sizes = [(60 + n, 20 + n) for n in range(8)]
    processes = await asyncio.gather(*(backend.spawn(shell(cols=c, rows=r), make_tags()) for c, r in sizes))
    try:
        for process, (cols, rows) in zip(processes, sizes, strict=True):
            await process.write(b"stty size\n")
            await read_until(process, f"{rows} {cols}".encode())
    finally:
        await asyncio.gather(*(process.terminate(grace=0.3) for process in processes))
    assert await settled_exec_processes(container) == []


async def test_detach_wakes_a_pending_read_and_later_writes_fail(container):
    process = await DockerBackend(container=container).spawn(shell("echo ready", "sleep 1000"), make_tags())
    await read_until(process, b"ready")
    reading = asyncio.ensure_future(process.read())
    await asyncio.sleep(0.3)
    assert not reading.done()
    await process.detach()
    assert await asyncio.wait_for(reading, 5) == b""
    with pytest.raises(BackendError, match="closed"):
        await process.write(b"echo hello\n")
    await DockerBackend(container=container).remove(process.handle, grace=0.3)
    assert await settled_exec_processes(container) == []


async def test_a_stream_broken_while_docker_writes_is_no_exit_while_the_execs_processes_run(container):
    """Docker records 126 for an exec whose client went away mid-write, while a HUP-proof program goes on:
    wait() must not report that as the program's exit, nor inspect() when no host pid can be checked."""
    backend = DockerBackend(container=container)
    script = "trap '' HUP; while :; do echo xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx; done"
    process = await backend.spawn(shell(script), make_tags())
    await read_until(process, b"xxxx")
    await asyncio.sleep(1.5)  # nobody reads: the program and dockerd block in write
    process._sock.shutdown(socket.SHUT_RDWR)
    api = docker.APIClient()
    said = wait_until(lambda: not (info := api.exec_inspect(process.handle.exec_id))["Running"] and info)
    assert said["ExitCode"] == 126
    with pytest.raises(BackendError, match="126"):
        exit = await asyncio.wait_for(process.wait(), 15)
        pytest.fail(f"wait() took docker's 126 for an exit: {exit}")
    assert exec_processes(container)
    remote = replace(process.handle, process=None)
    seen = await backend.inspect(remote)
    assert seen.status == Status.ALIVE, seen
    await process.detach()
    await backend.remove(remote, grace=0.3)
    assert await settled_exec_processes(container) == []
    seen = await backend.inspect(remote)
    assert seen.status == Status.GONE and seen.exit is None and "126" in seen.detail, seen


# Children that drop the marker but stay in the shell's session: one plain, one ignoring HUP and TERM, so it
# must still be killed after the shell (its session's leader) has died and docker has reaped it.
UNMARKED = (
    "env -u TETHER_PROCESS_MARKER sleep 1000 &"
    " env -u TETHER_PROCESS_MARKER sh -c \"trap '' HUP TERM; exec sleep 1001\" & echo ready",
    "sleep 1000",
)


@pytest.mark.parametrize("how", ["terminate", "remove"])
async def test_ending_from_inside_the_container_takes_session_members_without_the_marker(container, how):
    """No host pid in the handle: the in-container scan finds the marked processes and every process in the
    sessions they lead, as the local backend does; another terminal's program in the same container is left
    alone."""
    backend = DockerBackend(container=container)
    other = await backend.spawn(SpawnSpec(argv=("sleep", "1002")), make_tags())
    (stranger,) = wait_until(lambda: exec_processes(container))
    process = await backend.spawn(shell(*UNMARKED), make_tags())
    await read_until(process, b"ready")
    process.handle = replace(process.handle, process=None)
    wait_until(lambda: len(exec_processes(container)) >= 4)  # and our three sleeps (ash execs the last command)
    if how == "terminate":
        await asyncio.wait_for(process.terminate(grace=0.3), 30)
    else:
        await process.detach()
        await asyncio.wait_for(DockerBackend(container=container).remove(process.handle, grace=0.3), 30)
    assert wait_until(lambda: exec_processes(container) == [stranger] and [stranger])
    await other.terminate(grace=0.3)


async def test_an_idle_stream_read_on_a_thread_outlasts_the_clients_timeout(container, monkeypatch):
    """TLS and ssh engine streams are read and written on threads, on a socket that still had the client's
    request timeout: an idle terminal's output ended after it, as if the program had closed it."""
    monkeypatch.setattr(docker_process, "_loop_can_drive", lambda raw: False)
    process = await DockerBackend(container=container, timeout=1.0).spawn(shell(), make_tags())
    assert not process._on_loop
    try:
        await process.write(b"echo before-idle\n")
        await read_until(process, b"before-idle\r\n")
        reading = asyncio.ensure_future(read_until(process, b"after-idle-42"))
        await asyncio.sleep(2.5)  # idle for longer than the timeout, with a read pending
        assert not reading.done(), reading
        await process.write(b"echo after-idle-$((6*7))\n")
        await reading
    finally:
        await process.terminate(grace=0.3)


@pytest.mark.django_db
@pytest.mark.parametrize("engine", ["unix://{tmp}/no-docker.sock", "tcp://127.0.0.1:{port}"])
def test_a_machine_on_an_unreachable_engine_fails_to_spawn_naming_that_engine(container, tmp_path, engine):
    """The machine row's engine reaches the backend (registry.backend_for), not the local engine's default."""
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        engine = engine.format(tmp=tmp_path, port=unused.getsockname()[1])
        add_machine(name="far-box", backend="docker", ref=container, engine=engine, actor=Actor.command("tests"))
        backend = backend_for(Machine.objects.get(name="far-box"))
        with pytest.raises(SpawnError, match=f"docker engine {re.escape(engine)} is unreachable"):
            asyncio.run(backend.spawn(shell("echo never"), make_tags()))
    assert exec_processes(container) == []  # nothing started on the local engine instead
