"""tmux specifics: sessions that outlive their owner, tags, adoption, snapshots and honest exits."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path

import pytest

from terminals.backends import procfs
from terminals.backends.base import BackendError, Inspection, SpawnError, SpawnSpec, Status
from terminals.backends.handles import TmuxHandle, load
from terminals.backends.tmux import TmuxBackend
from tests.backends.conftest import left_behind, make_tags
from tests.backends.test_contract import drain, read_until, rss_kib

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def backend(tmux_socket) -> TmuxBackend:
    return TmuxBackend(socket=tmux_socket)


def tmux(socket: str, *args: str) -> str:
    return subprocess.run(["tmux", "-L", socket, *args], capture_output=True, text=True, check=True).stdout


def spawn_elsewhere(socket: str, *argv: str) -> tuple[subprocess.Popen, TmuxHandle]:
    """Spawn from another OS process, which can then be killed like a crashed worker."""
    spawner = subprocess.Popen(
        [sys.executable, "-m", "tests.backends.spawner", "tmux", json.dumps({"socket": socket}), *argv],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    return spawner, load(json.loads(spawner.stdout.readline()))


async def eventually(
    probe: Callable[[], Awaitable[Inspection]], done: Callable[[Inspection], bool], timeout: float = 10.0
) -> Inspection:
    async with asyncio.timeout(timeout):
        while not done(value := await probe()):
            await asyncio.sleep(0.05)
    return value


def dead_pane(
    socket: str, pane: str, shim: int, fmt: str = "#{pane_dead}|#{pane_dead_status}|#{pane_dead_signal}"
) -> str:
    """tmux's word on a dead pane. tmux 3.3a can miss the SIGCHLD under load and leave its dead pane's shim
    unreaped (seen about 1 run in 10 of the suite) with no status: the zombie itself still says how it ended."""
    said = tmux(socket, "display", "-p", "-t", pane, fmt).strip()
    server = int(tmux(socket, "display", "-p", "#{pid}"))
    dead, status, signum, *rest = said.split("|")
    if (dead, status, signum) == ("1", "", "") and (ended := procfs.zombie_end(shim, server)):
        status, signum = ended
    return "|".join((dead, status, signum, *rest))


def kill(spawner: subprocess.Popen) -> None:
    spawner.send_signal(signal.SIGKILL)
    spawner.wait()


async def test_a_session_survives_its_killed_spawner_and_its_exit_is_read_from_a_new_process(backend, tmux_socket):
    spawner, handle = spawn_elsewhere(tmux_socket, "/bin/sh")
    assert handle.backend == "tmux" and handle.socket == tmux_socket
    kill(spawner)
    seen = await TmuxBackend(socket=tmux_socket).inspect(handle)
    assert seen.status == Status.ALIVE
    assert seen.exit is None
    tmux(tmux_socket, "send-keys", "-t", handle.pane, "exit 4", "Enter")
    seen = await eventually(lambda: backend.inspect(handle), lambda seen: seen.status == Status.EXITED)
    assert (seen.exit.code, seen.exit.signal) == (4, None)
    # A new owner of the ended program gets the end of its output and the same exit.
    adopted = await backend.attach(handle)
    await drain(adopted)
    assert (await adopted.wait()).code == 4
    await backend.remove(handle, grace=0.5)
    assert (await backend.inspect(handle)).status == Status.GONE
    assert left_behind(handle.marker) == []


async def test_a_new_owner_adopts_a_live_session_and_sees_new_output(backend, tmux_socket):
    spawner, handle = spawn_elsewhere(tmux_socket, "/bin/sh")
    kill(spawner)
    process = await backend.attach(handle)
    try:
        me = make_tags()
        await backend.tag(handle, owner_pid=me.owner_pid, owner_started_at=me.owner_started_at, heartbeat=7)
        (listed,) = await backend.list_tagged()
        assert (listed.tags["owner_pid"], listed.tags["heartbeat"]) == (str(me.owner_pid), "7")
        await process.write(b"echo adopted-$((2+3))\n")
        await read_until(process, b"adopted-5")
        await process.write(b"exit 6\n")
        assert (await asyncio.wait_for(process.wait(), 10)).code == 6
    finally:
        await process.terminate(grace=0.5)


async def test_detach_leaves_the_program_running_for_a_later_owner(backend):
    process = await backend.spawn(SpawnSpec(argv=("/bin/sh",)), make_tags())
    await process.write(b"n=41\n")
    await process.detach()
    assert (await backend.inspect(process.handle)).status == Status.ALIVE
    again = await backend.attach(process.handle)
    try:
        await again.write(b"echo still-$((n+1))\n")
        await read_until(again, b"still-42")
    finally:
        await again.terminate(grace=0.5)


async def test_terminate_while_a_read_is_pending_ends_both(backend):
    process = await backend.spawn(SpawnSpec(argv=("/bin/sh",)), make_tags())
    await process.write(b"echo ready\n")
    await read_until(process, b"ready")

    async def pump() -> bytes:
        while chunk := await process.read():
            pass
        return chunk

    reading = asyncio.create_task(pump())
    await asyncio.sleep(0.2)
    await asyncio.wait_for(process.terminate(grace=0.5), 15)
    assert await asyncio.wait_for(reading, 5) == b""
    assert (await backend.inspect(process.handle)).status == Status.GONE


async def test_a_kill_while_the_owner_waits_for_the_exit_records_the_exit(backend):
    """The worker waits for the exit while a Kill ends the tree: the waiter gets the exit terminate read,
    not "no pane" from a session terminate has just removed (found by the churn benchmark)."""
    for _ in range(6):
        process = await backend.spawn(SpawnSpec(argv=("/bin/sh", "-c", "echo ready; exec sleep 1000")), make_tags())
        await read_until(process, b"ready")
        waiting = asyncio.create_task(process.wait())
        await asyncio.sleep(0.05)
        ended = await asyncio.wait_for(process.terminate(grace=0.5), 15)
        exit = await asyncio.wait_for(waiting, 15)
        assert ended is not None and exit == ended


async def test_the_server_outlives_its_last_session_so_the_next_open_cannot_meet_it_exiting(backend, tmux_socket):
    """A server that exited with its last session raced the next open on the same socket ("server exited
    unexpectedly", seen by the churn benchmark): it now stays up, empty, until someone kills it."""
    first = await backend.spawn(SpawnSpec(argv=("/bin/sh", "-c", "echo one; exec sleep 1000")), make_tags())
    await read_until(first, b"one")
    server = tmux(tmux_socket, "display-message", "-p", "#{pid}").strip()
    await first.terminate(grace=0.5)
    assert tmux(tmux_socket, "list-sessions", "-F", "#S") == ""  # no session left...
    assert tmux(tmux_socket, "display-message", "-p", "#{pid}").strip() == server  # ...and the same server
    second = await backend.spawn(SpawnSpec(argv=("/bin/sh", "-c", "echo two; exec sleep 1000")), make_tags())
    try:
        await read_until(second, b"two")
    finally:
        await second.terminate(grace=0.5)


async def test_opening_and_closing_sessions_side_by_side_never_crashes_the_tmux_server(backend, tmux_socket):
    """tmux 3.3a's server dies (SIGSEGV in control_write, tmux PR 4980) when a notification (a session made
    or closed, a client attached or gone) reaches a control client still identifying itself: every shell on
    the socket went with it, about one tmux session in 2,000 of the churn benchmark. Tether's own commands
    and control clients on a socket now take turns (terminals/backends/tmux_server.py, ``turn``)."""
    server = tmux(tmux_socket, "start-server", ";", "set", "-s", "exit-empty", "off", ";", "display", "-p", "#{pid}")
    opened = 0

    async def lane() -> None:
        nonlocal opened
        for _ in range(12):
            process = await backend.spawn(SpawnSpec(argv=("/bin/sh", "-c", "echo up; exec sleep 1000")), make_tags())
            await read_until(process, b"up")
            await process.terminate(grace=0.5)
            opened += 1

    await asyncio.gather(*(lane() for _ in range(4)))
    assert opened == 48
    assert tmux(tmux_socket, "display", "-p", "#{pid}") == server, "the tmux server was replaced: it crashed"


async def test_tagged_sessions_are_listed_and_an_untagged_one_is_never_touched(backend, tmux_socket):
    tags = make_tags("tether:session.1")  # ':' and '.' cannot be in a tmux session name
    process = await backend.spawn(SpawnSpec(argv=("sleep", "1000")), tags)
    tmux(tmux_socket, "new-session", "-d", "-s", "someone-else", "sleep 1000")
    stranger = tmux(tmux_socket, "display", "-p", "-t", "=someone-else:", "#{pane_id}").strip()

    listed = await backend.list_tagged()
    # The session as listed: the spawn's handle says also which server it was made in.
    assert [entry.handle for entry in listed] == [replace(process.handle, instance=None)]
    assert process.handle.instance == await backend.instance()
    assert listed[0].tags == {
        "session": "tether:session.1",
        "owner_pid": str(tags.owner_pid),
        "owner_started_at": str(tags.owner_started_at),
        "heartbeat": "0",
        "marker": tags.marker,
    }

    # A handle naming the stranger's pane, but not its marker, is refused; the real one is removed.
    forged = replace(process.handle, pane=stranger, session="someone-else")
    assert (await backend.inspect(forged)).status == Status.GONE
    await backend.remove(forged, grace=0.2)
    for entry in listed:
        await backend.remove(entry.handle, grace=0.5)
    assert await backend.list_tagged() == []
    assert tmux(tmux_socket, "list-sessions", "-F", "#{session_name}").split() == ["someone-else"]


async def test_snapshot_has_the_screen_with_colours_and_the_cursor(backend):
    spec = SpawnSpec(argv=("/bin/sh",), env={"PS1": "tether> "}, cols=70, rows=20)
    process = await backend.spawn(spec, make_tags())
    try:
        await process.write(b"printf 'hello-%s \\033[31mred\\033[0m\\n' snapshot\n")
        await read_until(process, b"red\x1b[0m\r\ntether> ")
        shot = await process.snapshot()
        assert b"hello-snapshot \x1b[31mred" in shot.screen
        assert (shot.cols, shot.rows) == (70, 20)
        plain = re.sub(rb"\x1b\[[0-9;]*m", b"", shot.screen).split(b"\n")
        assert plain[shot.cursor_y] == b"tether> "
        assert shot.cursor_x == len(b"tether> ")
    finally:
        await process.terminate(grace=0.5)


def screen_of(socket: str, pane: str) -> tuple[list[str], tuple[int, int]]:
    """The pane's visible rows as tmux shows them (not joined) and its cursor."""
    rows = tmux(socket, "capture-pane", "-p", "-t", pane).rstrip("\n").split("\n")
    x, y = tmux(socket, "display", "-p", "-t", pane, "#{cursor_x} #{cursor_y}").split()
    return rows, (int(x), int(y))


async def test_snapshot_joins_a_wrapped_line_and_keeps_the_cursor_where_the_pane_has_it(backend, tmux_socket, tmp_path):
    long = "abcdefghijklmnopqrstuvwxyz0123456789ABCD"  # two rows of a 20-column pane
    process = await backend.spawn(SpawnSpec(argv=("/bin/sh",), env={"PS1": "$ "}, cols=20, rows=10), make_tags())
    try:
        await read_until(process, b"$ ")
        await process.write(f"echo {long}\n".encode())
        await read_until(process, f"{long}\r\n$ ".encode())
        rows, cursor = screen_of(tmux_socket, process.handle.pane)
        assert rows[:6] == ["$ echo abcdefghijklm", "nopqrstuvwxyz0123456", "789ABCD", long[:20], long[20:], "$"]
        shot = await process.snapshot()
        assert shot.screen.split(b"\n")[:3] == [f"$ echo {long}".encode(), long.encode(), b"$ "]
        # The cursor is where the pane has it (row 5), not the joined line it is on (line 2).
        assert (shot.cursor_x, shot.cursor_y) == cursor == (2, 5)

        # Drawn on a terminal of the same size, the joined lines wrap back into the same rows.
        drawn = tmp_path / "snapshot"
        drawn.write_bytes(shot.render())
        viewer = await backend.spawn(
            SpawnSpec(argv=("sh", "-c", f"cat {drawn}; exec sleep 1000"), cols=20, rows=10), make_tags()
        )
        try:
            await read_until(viewer, b"\x1b[6;3H")
            assert screen_of(tmux_socket, viewer.handle.pane) == (rows, cursor)
        finally:
            await viewer.terminate(grace=0.2)
    finally:
        await process.terminate(grace=0.5)


async def test_the_last_output_before_a_fast_exit_is_never_lost(backend):
    # tmux alone drops what it has not passed on when the pane's process exits.
    process = await backend.spawn(SpawnSpec(argv=("sh", "-c", "seq 1 200000; printf the-end")), make_tags())
    output = await drain(process, timeout=60)
    assert output.endswith(b"199999\r\n200000\r\nthe-end")
    assert output.count(b"\r\n") == 200000
    assert (await process.wait()).code == 0


async def test_heavy_output_is_passed_on_in_large_pieces_and_arrives_whole(backend):
    """tmux hands a pane's output to its control client about 4 KiB at a time; each piece passed on costs every
    stage after the backend (the worker, Redis, daphne, the page) the same, so heavy output is gathered for a
    moment, and again while more comes, up to a 64 KiB read (a keystroke's echo never waits: it is too small
    to be gathered). Measured here: about 62 KiB a read; gathering once gave 21-23 KiB, not at all 4.4 KiB."""
    script = "stty -opost; head -c 6000000 /dev/zero | tr '\\0' x; printf the-end"
    process = await backend.spawn(SpawnSpec(argv=("sh", "-c", script)), make_tags())
    sizes = []
    while chunk := await asyncio.wait_for(process.read(), 30):
        sizes.append(len(chunk))
        if chunk.endswith(b"the-end"):
            break
    assert sum(sizes) == 6_000_000 + len(b"the-end")
    mean = sum(sizes) / len(sizes)
    print(f"{len(sizes)} reads, {mean / 1024:.1f} KiB each on average")
    # Gathered, or not: tmux's own pieces are about 4 KiB. How large the gathered reads are depends on how fast
    # tmux runs beside the rest of a loaded machine (62 KiB alone, 30 KiB once in a full run): bench/, not here.
    assert mean >= 16 * 1024
    await process.terminate(0.5)


async def test_the_program_sees_its_own_environment_not_tmux_or_worker_secrets(backend, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", "postgres://secret@db/tether")
    script = "echo db=[$DATABASE_URL] term=$TERM tmux=[$TMUX$TMUX_PANE$TERM_PROGRAM] marker=$TETHER_PROCESS_MARKER"
    tags = make_tags()
    process = await backend.spawn(SpawnSpec(argv=("sh", "-c", script)), tags)
    output = await drain(process)
    assert f"db=[] term=xterm-256color tmux=[] marker={tags.marker}".encode() in output


async def test_arguments_reach_the_program_unchanged(backend):
    # tmux would end a command at an argument ending in ';', and expands formats in some arguments.
    argv = ("sh", "-c", 'printf "[%s]" "$@" "$SEMI"', "sh", "a;", "b\\;", ";", "#{pane_id}")
    process = await backend.spawn(SpawnSpec(argv=argv, env={"SEMI": "v;"}), make_tags())
    assert await drain(process) == b"[a;][b\\;][;][#{pane_id}][v;]"


async def test_a_signal_is_reported_as_a_signal(backend):
    process = await backend.spawn(SpawnSpec(argv=("sh", "-c", "echo up; kill -TERM $$")), make_tags())
    await drain(process)
    exit = await asyncio.wait_for(process.wait(), 10)
    assert (exit.code, exit.signal) == (None, signal.SIGTERM)
    assert (await backend.inspect(process.handle)).exit == exit


async def test_a_shim_killed_before_it_recorded_the_exit_leaves_the_exit_unknown(backend, tmux_socket, tmp_path):
    """tmux's pane_dead_status / pane_dead_signal are the shim's. They are the program's only when the shim ran
    to its end, and then it had recorded @tether_exit first. Here the shim is killed: the program ends by its
    HUP trap with code 3 while tmux says signal 9, so no exit may be read back."""
    ended = tmp_path / "ended"
    script = f"trap 'echo 3 > {ended}; exit 3' HUP; echo ready; sleep 1000 & wait"
    process = await backend.spawn(SpawnSpec(argv=("sh", "-c", script)), make_tags())
    pane = process.handle.pane
    await read_until(process, b"ready")
    shim = int(tmux(tmux_socket, "display", "-p", "-t", pane, "#{pane_pid}"))
    os.kill(shim, signal.SIGKILL)
    fmt = "#{pane_dead}|#{pane_dead_status}|#{pane_dead_signal}|#{@tether_exit}"
    said = await eventually(
        lambda: asyncio.to_thread(dead_pane, tmux_socket, pane, shim, fmt),
        lambda said: said.startswith("1|") and said != "1|||",  # the pane may die before tmux reaps the shim
    )
    assert said == "1||9|"  # only the fallback is left
    assert ended.read_text() == "3\n"  # how the program really ended
    seen = await TmuxBackend(socket=tmux_socket).inspect(process.handle)
    assert (seen.status, seen.exit) == (Status.UNKNOWN, None)
    assert "signal 9" in seen.detail
    with pytest.raises(BackendError, match="no exit"):
        await asyncio.wait_for(process.wait(), 10)
    assert await asyncio.wait_for(process.terminate(grace=0.2), 15) is None
    assert (await backend.inspect(process.handle)).status == Status.GONE
    assert left_behind(process.handle.marker) == []


async def test_a_missing_program_is_a_spawn_error_and_leaves_nothing(backend):
    with pytest.raises(SpawnError, match="not found"):
        await backend.spawn(SpawnSpec(argv=("no-such-program-tether",)), make_tags())
    assert await backend.list_tagged() == []


class FailingAttach(TmuxBackend):
    """A backend whose control client cannot attach, as when tmux refuses it right after the session is made."""

    async def _adopt(self, handle: TmuxHandle):
        raise BackendError("refused for the test")


async def test_a_spawn_that_fails_after_its_session_exists_leaves_no_shim_waiting(tmux_socket):
    """The shim waits for the owner's go before it starts the program; when the owner gives up first, the shim
    (and the tmux client it waits through) are ended, and the program never runs."""
    tags = make_tags()
    with pytest.raises(SpawnError, match="refused for the test"):
        await FailingAttach(socket=tmux_socket).spawn(SpawnSpec(argv=("sh", "-c", "echo ran > /dev/null")), tags)
    assert left_behind(tags.marker) == []
    assert tmux(tmux_socket, "list-sessions", "-F", "#S") == ""


async def test_a_stalled_reader_keeps_the_tmux_server_small(backend, tmux_socket):
    line = b"x" * 200 + b"\r\n"
    process = await backend.spawn(SpawnSpec(argv=("yes", "x" * 200)), make_tags())
    try:
        await read_until(process, line * 2)
        server = int(tmux(tmux_socket, "display", "-p", "#{pid}"))
        await asyncio.sleep(0.5)
        before = rss_kib(server)
        await asyncio.sleep(3)
        # Without stopping the terminal, tmux 3.3a could buffer 5-15 MiB/s here for a reader that is away.
        assert rss_kib(server) - before < 4 * 1024
        await read_until(process, line * 2)
    finally:
        await process.terminate(grace=0.5)


async def test_a_resize_while_the_reader_is_stalled_is_done_at_once_and_holds_nobody_up(backend, tmux_socket):
    """A shell whose viewer is away (nothing reads it) is resized, and another shell opens on the socket
    meanwhile: neither waits for the stalled stream (a resize used to hold its turn on the socket until its
    reply came in line with that output, 2 s)."""
    line = b"x" * 200 + b"\r\n"
    process = await backend.spawn(SpawnSpec(argv=("yes", "x" * 200)), make_tags())
    other = None
    try:
        await read_until(process, line * 2)
        await asyncio.sleep(1)  # nothing read: the stream is held back
        began = time.monotonic()
        resizing = asyncio.ensure_future(process.resize(100, 30))
        other = await backend.spawn(SpawnSpec(argv=("/bin/sh", "-c", "echo up; exec sleep 1000")), make_tags())
        await resizing
        assert time.monotonic() - began < 1.5
        size = tmux(tmux_socket, "display", "-p", "-t", process.handle.pane, "#{pane_width}x#{pane_height}")
        assert size.strip() == "100x30"
        await read_until(other, b"up")
    finally:
        await process.terminate(grace=0.5)
        if other is not None:
            await other.terminate(grace=0.5)


async def test_owner_tags_are_the_user_options_named_in_the_issue(backend, tmux_socket):
    """Read with tmux itself, not through the backend's own list of names."""
    tags = make_tags("tether-tagged")
    process = await backend.spawn(SpawnSpec(argv=("sleep", "1000")), tags)
    try:

        def option(name: str) -> str:
            return tmux(tmux_socket, "show-options", "-t", f"={process.handle.session}:", "-v", name).strip()

        assert option("@tether_session") == "tether-tagged"
        assert option("@tether_owner_pid") == str(tags.owner_pid)
        assert option("@tether_owner_started_at") == str(tags.owner_started_at)
        assert option("@tether_heartbeat") == "0"
        await backend.tag(process.handle, owner_pid=4242, owner_started_at=99, heartbeat=17)
        assert option("@tether_owner_pid") == "4242"
        assert option("@tether_owner_started_at") == "99"
        assert option("@tether_heartbeat") == "17"
    finally:
        await process.terminate(grace=0.2)


@pytest.mark.parametrize(("ending", "dead"), [("exit 7", "1|7|"), ("kill -TERM $$", "1||15")])
async def test_the_dead_pane_ends_as_its_program_did(backend, tmux_socket, ending, dead):
    """Once the owner has read everything (which releases the shim), the shim ends as the program did, so
    tmux's own pane_dead_status / pane_dead_signal are the program's."""
    process = await backend.spawn(SpawnSpec(argv=("sh", "-c", f"echo up; {ending}")), make_tags())
    await drain(process)
    await asyncio.wait_for(process.wait(), 10)
    pane = process.handle.pane

    shim = int(tmux(tmux_socket, "display", "-p", "-t", pane, "#{pane_pid}").strip())
    # The pane may be dead a moment before tmux has reaped the shim and read its status.
    said = await eventually(
        lambda: asyncio.to_thread(dead_pane, tmux_socket, pane, shim), lambda said: said not in ("0||", "1||")
    )
    assert said == dead
    await backend.remove(process.handle, grace=0.2)
