"""Local PTY specifics: what another process can know after the owner died, and honest spawn errors. The
worker's own PTY ("plain", no session holder) is what these test unless they say held; held shells'
own properties are in test_holder.py."""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import uuid
from dataclasses import replace
from pathlib import Path

import pytest

from terminals.backends.base import SpawnError, SpawnSpec, Status
from terminals.backends.handles import Handle, load
from terminals.backends.local import LocalBackend
from terminals.backends.procfs import ProcessIdentity, boot_id, find_tree, session_of
from tests.backends.conftest import make_tags, session_leader, wait_until
from tests.backends.test_contract import read_until

ROOT = Path(__file__).resolve().parents[2]


async def test_a_plain_shell_whose_spawner_was_killed_is_gone_and_no_exit_is_invented():
    spawner = subprocess.Popen(
        [sys.executable, "-m", "tests.backends.spawner", "local", '{"holder": null}', "/bin/sh", "-c", "sleep 1000"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    handle = load(json.loads(spawner.stdout.readline()))
    backend = LocalBackend(holder=None)
    assert (await backend.inspect(handle)).status == Status.ALIVE
    spawner.send_signal(signal.SIGKILL)
    spawner.wait()
    # The PTY master died with its owner, so the session was hung up.
    identity = handle.process
    wait_until(lambda: not identity.is_alive())
    seen = await backend.inspect(handle)
    assert seen.status == Status.GONE
    assert seen.exit is None
    assert find_tree(marker=handle.marker) == []


async def test_a_reused_pid_is_never_taken_for_the_original_process():
    backend = LocalBackend(holder=None)
    process = await backend.spawn(SpawnSpec(argv=("sleep", "100")), make_tags())
    # The recorded process (pid, another start time) and its tree (another marker) are gone; the pid now
    # names a stranger to that handle.
    forged = replace(process.handle, process=replace(process.handle.process, start_time=1), marker="0" * 24)
    assert (await backend.inspect(forged)).status == Status.GONE
    assert not forged.process.signal(signal.SIGKILL)
    assert (await backend.inspect(process.handle)).status == Status.ALIVE
    await process.terminate(grace=0.2)


async def test_an_identity_from_another_boot_is_never_taken_for_a_live_process(stranger):
    """Same pid, same start time, another boot: after a reboot both numbers can name a new process."""
    other_boot = ProcessIdentity(pid=stranger.pid, start_time=stranger.start_time, boot_id=str(uuid.uuid4()))
    assert not other_boot.is_alive()
    assert not other_boot.is_present()
    assert not other_boot.signal(signal.SIGKILL)
    handle = load({"backend": "local", "process": other_boot.to_json(), "marker": secrets.token_hex(12)})
    assert (await LocalBackend(holder=None).inspect(handle)).status == Status.GONE
    await LocalBackend(holder=None).remove(handle, grace=0.2)  # the stranger leads a session of that very number
    assert stranger.is_alive()


def stale_handle(pid: int, start_time: int) -> Handle:
    return load(
        {
            "backend": "local",
            "process": {"pid": pid, "start_time": start_time, "boot_id": boot_id()},
            "marker": secrets.token_hex(12),
        }
    )


async def test_removing_a_stale_handle_spares_a_stranger_whose_session_reuses_the_pid(stranger):
    await LocalBackend(holder=None).remove(stale_handle(stranger.pid, stranger.start_time + 1), grace=0.2)
    assert stranger.is_alive()


async def test_terminating_a_stale_process_spares_a_stranger_whose_session_reuses_the_pid(stranger):
    process = await LocalBackend(holder=None).spawn(SpawnSpec(argv=("true",)), make_tags())
    ended = await asyncio.wait_for(process.wait(), 10)
    # Its pid is free now; suppose the stranger got it. The handle still says ours started earlier.
    process.identity = ProcessIdentity(stranger.pid, stranger.start_time - 1, process.identity.boot_id)
    assert await asyncio.wait_for(process.terminate(grace=0.2), 15) == ended
    assert stranger.is_alive()


async def test_removing_a_handle_whose_leader_is_gone_spares_unmarked_members_of_that_session_number():
    """The stranger's session outlived its leader: its number is the stale handle's pid, but nothing in it
    carries our marker."""
    leader = session_leader("sh", "-c", "sleep 1000 & echo $!")
    member = ProcessIdentity.of(int(leader.stdout.readline()))
    leader.wait()
    try:
        assert session_of(member.pid) == leader.pid and ProcessIdentity.of(leader.pid) is None
        await LocalBackend(holder=None).remove(stale_handle(leader.pid, 1), grace=0.2)
        assert member.is_alive()
    finally:
        member.signal(signal.SIGKILL)
        leader.stdout.close()


async def test_terminate_ends_an_unmarked_session_member_that_ignores_sigterm_after_its_leader_is_reaped():
    """Session members are ours while the leader holds the session's number; one found then stays on the
    list, so it is still killed once the leader has died and been reaped."""
    unmarked = "env -u TETHER_PROCESS_MARKER sh -c \"trap '' HUP TERM; echo member-\\$\\$-up; exec sleep 1000\""
    process = await LocalBackend(holder=None).spawn(
        SpawnSpec(argv=("sh", "-c", f"{unmarked} & sleep 1000")), make_tags()
    )
    member = ProcessIdentity.of(int(re.search(rb"member-(\d+)-up", await read_until(process, b"-up")).group(1)))
    assert session_of(member.pid) == process.identity.pid
    waiting = asyncio.ensure_future(process.wait())  # reaps the leader as soon as it dies, as an owner does
    try:
        await asyncio.wait_for(process.terminate(grace=0.3), 15)
        assert waiting.done()
        assert not member.is_alive()
    finally:
        member.signal(signal.SIGKILL)


async def test_trees_ended_at_once_are_all_ended_in_passes_over_proc_they_share():
    """Ending a tree reads every process on the host, a few times. Twenty trees ended together (each a shell
    with a HUP-proof child that left its session) are all gone, in passes they share: ending 5,000 idle shells
    on a host of 15,000 processes, a pass each, managed about 0.3 trees a second."""
    from terminals.backends import procfs

    passes = asked = 0
    original_read, original_table = procfs.ProcessTable.__dict__["read"], procfs.shared_table
    read = procfs.ProcessTable.read

    def counted(with_sessions=True):
        nonlocal passes
        passes += 1
        return read(with_sessions)

    async def counted_table(fresh_from, **kind):
        nonlocal asked
        asked += 1
        return await original_table(fresh_from, **kind)

    escaped = "setsid sh -c \"trap '' HUP TERM; echo escaped-\\$\\$-up; exec sleep 1000\""
    processes = [
        await LocalBackend(holder=None).spawn(SpawnSpec(argv=("sh", "-c", f"{escaped} & sleep 1000")), make_tags())
        for _ in range(20)
    ]
    children = []
    for process in processes:
        seen = await read_until(process, b"-up")
        children.append(ProcessIdentity.of(int(re.search(rb"escaped-(\d+)-up", seen).group(1))))
    for child, process in zip(children, processes, strict=True):
        assert session_of(child.pid) != process.identity.pid  # out of the shell's session: found by its marker
    procfs.ProcessTable.read, procfs.shared_table = staticmethod(counted), counted_table
    try:
        await asyncio.wait_for(asyncio.gather(*(process.terminate(grace=0.3) for process in processes)), 60)
    finally:
        procfs.ProcessTable.read, procfs.shared_table = original_read, original_table
        for child in children:
            child.signal(signal.SIGKILL)
    assert not any(child.is_alive() for child in children)
    assert not any(process.identity.is_alive() for process in processes)
    assert 0 < passes * 3 < asked, (passes, asked)  # one pass answered many trees' scans


async def test_worker_secrets_do_not_leak_into_the_shell(monkeypatch):
    monkeypatch.setenv("DATABASE_URL", "postgres://secret@db/tether")
    backend = LocalBackend()
    process = await backend.spawn(SpawnSpec(argv=("sh", "-c", "echo db=[$DATABASE_URL] term=$TERM")), make_tags())
    output = b""
    while chunk := await process.read():
        output += chunk
    assert b"db=[] term=xterm-256color" in output


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (SpawnSpec(argv=("no-such-program-xyz",)), "program not found"),
        (SpawnSpec(argv=("sh",), cwd="/no/such/dir"), "working directory does not exist"),
    ],
)
async def test_spawn_errors_are_clear(spec, message):
    with pytest.raises(SpawnError, match=message):
        await LocalBackend().spawn(spec, make_tags())


def test_a_signal_reaches_the_recorded_process_and_never_an_exited_or_reaped_one():
    """signal() pins the process with a pidfd, checks its identity, then signals through the pidfd."""
    child = subprocess.Popen(["sleep", "1000"])
    identity = ProcessIdentity.of(child.pid)
    assert identity.signal(0) and identity.is_alive()
    assert identity.signal(signal.SIGTERM)
    wait_until(lambda: not identity.is_alive())  # a zombie now: exited, its pid still held
    assert identity.is_present() and not identity.signal(signal.SIGKILL)
    assert child.wait() == -signal.SIGTERM
    assert not identity.is_present() and not identity.signal(signal.SIGKILL)  # reaped: the pid is free


def test_a_process_not_ours_to_signal_is_said_not_signalled_not_raised():
    """A worker that is not root, ending a tree with another user's process in it (a sudo in the shell),
    is told the signal was not sent: raised, it stopped the round after the rest of the tree was stopped
    (SIGSTOP), so they never went on. Run as nobody against a root process; Debian's python3, since the
    venv's may sit where nobody can read it."""
    assert os.getuid() == 0, "this test plays another user with setpriv, which needs root"
    root_process = subprocess.Popen(["sleep", "1000"])
    try:
        done = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c",
             "import sys; sys.path.insert(0, sys.argv[1]); from terminals.backends.procfs import ProcessIdentity;"
             " print(ProcessIdentity.of(int(sys.argv[2])).signal(15))",
             str(Path(__file__).resolve().parents[2]), str(root_process.pid)],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert (done.returncode, done.stdout.strip()) == (0, "False"), done.stderr
        assert root_process.poll() is None  # and it was indeed not signalled
    finally:
        root_process.kill()
        root_process.wait()
