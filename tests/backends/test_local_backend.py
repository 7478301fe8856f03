"""Local PTY specifics: what another process can know after the owner died, and honest spawn errors."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from terminals.backends.base import SpawnError, SpawnSpec, Status
from terminals.backends.local import LocalBackend
from terminals.backends.procfs import ProcessIdentity, find_tree
from tests.backends.conftest import make_tags, wait_until

ROOT = Path(__file__).resolve().parents[2]


async def test_inspect_after_the_spawner_was_killed_says_gone_and_never_invents_an_exit():
    spawner = subprocess.Popen(
        [sys.executable, "-m", "tests.backends.spawner", "local", "{}", "/bin/sh", "-c", "sleep 1000"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    handle = json.loads(spawner.stdout.readline())
    backend = LocalBackend()
    assert (await backend.inspect(handle)).status == Status.ALIVE
    spawner.send_signal(signal.SIGKILL)
    spawner.wait()
    # The PTY master died with its owner, so the session was hung up.
    identity = ProcessIdentity.from_json(handle["process"])
    wait_until(lambda: not identity.is_alive())
    seen = await backend.inspect(handle)
    assert seen.status == Status.GONE
    assert seen.exit is None
    assert find_tree(marker=handle["marker"]) == []


async def test_a_reused_pid_is_never_taken_for_the_original_process():
    backend = LocalBackend()
    process = await backend.spawn(SpawnSpec(argv=("sleep", "100")), make_tags())
    forged = dict(process.handle, process={**process.handle["process"], "start_time": 1})
    assert (await backend.inspect(forged)).status == Status.GONE
    assert not ProcessIdentity.from_json(forged["process"]).signal(signal.SIGKILL)
    assert (await backend.inspect(process.handle)).status == Status.ALIVE
    await process.terminate(grace=0.2)


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
