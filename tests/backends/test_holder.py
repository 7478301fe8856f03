"""The session holder (holder/tether-holder.c), driven as the real binary over its real socket: it keeps the
program whoever its client is, refuses strangers, survives bad clients, and tells the end honestly."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import random
import re
import secrets
import select
import shlex
import signal
import socket
import stat
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from terminals.backends.base import SpawnSpec
from terminals.backends.docker import DockerBackend
from terminals.backends.handles import DockerHandle, load
from terminals.backends.holder import holder_binary
from terminals.backends.holder_wire import Frame, frame, parse_record
from terminals.backends.local import LocalBackend
from terminals.backends.procfs import ProcessIdentity
from tests.backends.conftest import make_tags, settled_exec_processes, wait_until
from tests.backends.test_contract import drain, read_until
from tests.conftest import HELD_DIR

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def binary() -> Path:
    path = holder_binary()
    assert path is not None, "the session holder is not built: make holder"
    return path


class Raw:
    """A client speaking the holder's frames over a plain blocking socket."""

    def __init__(self, place: Path):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.settimeout(10)
        self.sock.connect(str(place / "sock"))

    def send(self, kind: int, payload: bytes = b"") -> None:
        self.sock.sendall(frame(kind, payload))

    def attach(self, secret: str, since: int = 0) -> tuple[int, int, int, int, bool]:
        self.send(Frame.ATTACH, secret.encode() + struct.pack(">Q", since))
        kind, payload = self.next()
        assert kind == Frame.ATTACHED, (chr(kind), payload)
        resume, lost, total, pid = struct.unpack_from(">QQQI", payload)
        return resume, lost, total, pid, bool(payload[28])

    def next(self) -> tuple[int, bytes] | None:
        head = self._exactly(5)
        if head is None:
            return None
        kind, length = struct.unpack(">BI", head)
        return kind, self._exactly(length) or b""

    def _exactly(self, n: int) -> bytes | None:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                return None
            data += chunk
        return data

    def output_until(self, needle: bytes) -> bytes:
        seen = b""
        while needle not in seen:
            got = self.next()
            assert got is not None, seen
            if got[0] == Frame.OUTPUT:
                seen += got[1][8:]
        return seen

    def close(self) -> None:
        self.sock.close()


def start(binary: Path, *argv: str, ring: int = 1024 * 1024, secret: str | None = None) -> tuple[Path, str, int]:
    place = Path(HELD_DIR) / f"raw-{secrets.token_hex(6)}"
    Path(HELD_DIR).mkdir(mode=0o700, exist_ok=True)
    secret = secret or secrets.token_hex(24)
    answer = subprocess.run(
        [str(binary), "serve", str(place), "--ring", str(ring), "--", *argv],
        input=f"{secret}\n".encode(),
        capture_output=True,
        timeout=30,
        check=True,
    ).stdout.split()
    return place, secret, int(answer[1])


def end(holder_pid: int) -> None:
    try:
        os.kill(holder_pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def test_a_wrong_secret_is_refused_and_the_right_one_still_attaches(binary):
    place, secret, holder = start(binary, "/bin/sh")
    try:
        for wrong in ("", secret[:-1], secret + "x", "y" * len(secret)):
            stranger = Raw(place)
            stranger.send(Frame.ATTACH, wrong.encode() + struct.pack(">Q", 0))
            assert stranger.next() == (Frame.ERROR, b"refused: wrong secret")
            assert stranger.next() is None
            stranger.close()
        client = Raw(place)
        client.attach(secret)
        client.send(Frame.INPUT, b"echo ok-$((6*7))\n")
        assert b"ok-42" in client.output_until(b"ok-42")
    finally:
        end(holder)


def test_the_secret_is_in_no_argv_or_environment_and_only_this_user_reaches_the_socket(binary):
    place, secret, holder = start(binary, "/bin/sh", "-c", "sleep 100")
    try:
        client = Raw(place)
        *_, pid, _ = client.attach(secret)
        for process in (holder, pid):
            for part in ("cmdline", "environ"):
                assert secret.encode() not in Path(f"/proc/{process}/{part}").read_bytes()
        assert stat.S_IMODE(place.stat().st_mode) == 0o700
        assert stat.S_IMODE((place / "sock").stat().st_mode) & 0o077 == 0
    finally:
        end(holder)


def test_a_newer_attach_replaces_the_older_and_the_program_runs_on(binary):
    place, secret, holder = start(binary, "/bin/sh")
    try:
        first = Raw(place)
        *_, pid, _ = first.attach(secret)
        second = Raw(place)
        assert second.attach(secret)[3] == pid
        while (got := first.next())[0] == Frame.OUTPUT:
            pass  # the prompt, sent before the newer attach came
        assert got == (Frame.ERROR, b"replaced by a newer attach")
        assert first.next() is None
        second.send(Frame.INPUT, b"echo still-$$\n")
        assert f"still-{pid}".encode() in second.output_until(f"still-{pid}".encode())
    finally:
        end(holder)


def test_an_offset_older_than_what_is_kept_is_told_as_lost(binary):
    place, secret, holder = start(binary, "/bin/sh", "-c", "head -c 20000 /dev/zero | tr '\\0' x; sleep 100", ring=4096)
    try:
        client = Raw(place)
        client.attach(secret)
        received = 0
        while received < 20000:
            kind, payload = client.next()
            if kind == Frame.OUTPUT:
                received = struct.unpack_from(">Q", payload)[0] + len(payload) - 8
                client.send(Frame.ACK, struct.pack(">Q", received - 1000))  # keep the last 1000 bytes
        again = Raw(place)
        resume, lost, total, _, _ = again.attach(secret, since=0)
        assert total >= 20000 and lost == resume and 0 < total - resume <= 4096
        assert Raw(place).attach(secret, since=total)[:2] == (total, 0)  # from where it is: nothing lost
    finally:
        end(holder)


@pytest.mark.parametrize(
    ("script", "record"),
    [("exit 137", "code=137"), ("kill -9 $$", "signal=9"), ("exit 0", "code=0")],
)
def test_the_end_is_recorded_as_the_program_ended_and_a_sigkill_is_never_exit_137(binary, script, record):
    place, secret, holder = start(binary, "/bin/sh", "-c", f"echo go; {script}")
    try:
        client = Raw(place)
        client.attach(secret)
        frames = []
        while (got := client.next()) is not None and got[0] != Frame.EXIT:
            frames.append(got)
        assert got is not None, "no exit frame"
        assert got[1].decode().split()[0] == record
        assert (place / "exit").read_text().split()[0] == record
        assert b"go" in b"".join(p[8:] for kind, p in frames if kind == Frame.OUTPUT)
        parsed = parse_record((place / "exit").read_text())
        assert (parsed.code, parsed.signal) == ((None, 9) if "signal" in record else (int(record[5:]), None))
        client.send(Frame.QUIT)
        wait_until(lambda: not Path(f"/proc/{holder}").exists() or not (place / "sock").exists())
    finally:
        end(holder)


def test_thousands_of_malformed_frames_leave_the_program_running_and_a_proper_attach_works(binary):
    place, secret, holder = start(binary, "/bin/sh")
    rng = random.Random(17)
    try:
        client = Raw(place)
        *_, pid, _ = client.attach(secret)
        client.send(Frame.INPUT, b"echo before-$$\n")
        client.output_until(f"before-{pid}".encode())
        bad = [
            lambda: rng.randbytes(rng.randrange(1, 64)),  # noise
            lambda: struct.pack(">BI", Frame.ATTACH, 0xFFFFFFFF),  # a huge length
            lambda: struct.pack(">BI", Frame.INPUT, 2 * 1024 * 1024) + b"x" * 100,  # over the limit
            lambda: frame(Frame.RESIZE, b"\x00\x00\x00\x00"),  # a zero grid (before an attach: refused anyway)
            lambda: frame(Frame.ATTACH, rng.randbytes(40)),  # a guessed secret
            lambda: frame(Frame.ATTACH, b""),  # no secret, no offset
            lambda: frame(Frame.QUIT),  # quitting before the attach
            lambda: struct.pack(">BI", Frame.OUTPUT, 5)[:3],  # half a header, then gone
            lambda: frame(rng.randrange(256), rng.randbytes(rng.randrange(0, 300))),
        ]
        for round_ in range(3000):
            stranger = socket.socket(socket.AF_UNIX)
            stranger.settimeout(5)
            while True:
                try:
                    stranger.connect(str(place / "sock"))
                    break
                except BlockingIOError:  # its backlog is full for a moment, as for any unix socket
                    time.sleep(0.001)
            try:
                stranger.sendall(bad[round_ % len(bad)]())
                if round_ % 3 == 0:
                    stranger.shutdown(socket.SHUT_WR)  # half-closed
            except OSError:
                pass  # the holder dropped it first
            stranger.close()
        # The attached client's own bad frames drop it, and only it.
        for payload in (frame(Frame.RESIZE, b"\x00"), frame(Frame.ACK, b"1"), frame(ord("?"), b"")):
            client = Raw(place)
            client.attach(secret)
            client.sock.sendall(payload)
            while client.next() is not None:
                pass
            client.close()
        assert ProcessIdentity.of(pid) is not None and ProcessIdentity.of(holder) is not None
        client = Raw(place)
        assert client.attach(secret)[3] == pid
        client.send(Frame.RESIZE, struct.pack(">HH", 101, 37))
        client.send(Frame.INPUT, b"stty size; echo after-$$\n")
        seen = client.output_until(f"after-{pid}".encode())
        assert b"37 101" in seen
    finally:
        end(holder)


def test_descriptors_its_starter_inherited_are_kept_by_neither_the_holder_nor_the_program(binary):
    """A parent that leaves a pipe inheritable (uvloop's subprocesses get their stdio socketpairs that way)
    still reads the holder's answer to its end: the holder keeps no descriptor it was not given for itself,
    so the starter's stdout reaches EOF, and the shell never sees the parent's pipe (before: the starter's
    parent waited for ever)."""
    place = Path(HELD_DIR) / f"raw-{secrets.token_hex(6)}"
    Path(HELD_DIR).mkdir(mode=0o700, exist_ok=True)
    secret = secrets.token_hex(24)
    # The starter's stdout, also passed at a second number: as uvloop (libuv) starts a subprocess.
    out_read, out_write = os.pipe()
    try:
        starter = subprocess.Popen(
            [str(binary), "serve", str(place), "--", "/bin/sh", "-c", "sleep 100"],
            stdin=subprocess.PIPE,
            stdout=out_write,
            pass_fds=(out_write,),
        )
        os.close(out_write)  # from here only what the starter passed on holds it
        starter.stdin.write(f"{secret}\n".encode())
        starter.stdin.close()
        out, deadline = b"", time.monotonic() + 10
        while (ready := select.select([out_read], [], [], max(deadline - time.monotonic(), 0))[0]) and (
            chunk := os.read(out_read, 4096)
        ):
            out += chunk
        assert ready, f"the starter's stdout never ended (read so far: {out!r}): something kept it open"
        assert starter.wait(timeout=10) == 0
        holder = int(out.split()[1])
        try:
            client = Raw(place)
            *_, pid, _ = client.attach(secret)
            pipe = f"pipe:[{os.fstat(out_read).st_ino}]"
            for process in (holder, pid):
                held = {os.readlink(f"/proc/{process}/fd/{fd}") for fd in os.listdir(f"/proc/{process}/fd")}
                assert pipe not in held, (process, held)
        finally:
            end(holder)
    finally:
        os.close(out_read)


async def test_a_held_shell_outlives_the_process_that_started_it_and_another_attaches_to_it():
    """Its starter killed with SIGKILL, the shell runs on under its holder: another process attaches, finds
    the same pid and everything it wrote (the offset is the holder's), and reads the exit it recorded."""
    spawner = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.backends.spawner",
            "local",
            "{}",
            "/bin/sh",
            "-c",
            "read line; echo got-$line; exit 4",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    handle = load(json.loads(spawner.stdout.readline()))
    spawner.send_signal(signal.SIGKILL)
    spawner.wait()
    assert handle.holder is not None
    backend = LocalBackend()
    seen = await backend.inspect(handle)
    assert seen.status.value == "alive" and seen.held
    process = await backend.attach(handle)
    assert process.pid == handle.process.pid and process.stream_origin == 0
    await process.write(b"xyz\n")
    output = await drain(process)
    assert b"got-xyz" in output
    exit = await process.wait()
    assert (exit.code, exit.source) == (4, "the session holder's record")
    await process.release()
    wait_until(lambda: not Path(handle.holder.dir).exists())


async def test_terminate_ends_the_whole_session_and_the_holder_records_the_signal():
    process = await LocalBackend().spawn(SpawnSpec(argv=("/bin/sh", "-c", "sleep 1000 & echo up; wait")), make_tags())
    await read_until(process, b"up")
    reading = asyncio.ensure_future(drain(process))
    started = time.monotonic()
    exit = await process.terminate(grace=0.5)
    assert exit.signal in (signal.SIGHUP, signal.SIGTERM) and exit.code is None
    assert time.monotonic() - started < 10
    await asyncio.wait_for(reading, 10)
    await process.release()


# A child of the shell that double-forks, calls setsid, clears its environment (Tether's marker with it) and
# ignores HUP and TERM: it leaves the shell's session and carries no marker, every net but its ancestry.
DAEMON = "trap '' HUP TERM; echo daemon-$$-up; exec sleep 1000"
LEAVES_EVERY_NET = f"(setsid env -i sh -c {shlex.quote(DAEMON)} &); exec sleep 1000"


def _parent_of(pid: int) -> int:
    raw = Path(f"/proc/{pid}/stat").read_text()
    return int(raw[raw.rindex(")") + 2 :].split()[1])


def test_the_kill_frame_ends_a_daemon_that_left_the_session_and_the_marker(binary):
    """The holder is a child subreaper: the daemon the program left behind is the holder's child, not
    init's, and the holder's K frame ends it (KILL after the grace) with nobody else looking for it."""
    place, secret, holder_pid = start(binary, "/bin/sh", "-c", LEAVES_EVERY_NET)
    daemon = None
    try:
        client = Raw(place)
        client.attach(secret)
        seen = client.output_until(b"-up")
        daemon = ProcessIdentity.of(int(re.search(rb"daemon-(\d+)-up", seen).group(1)))
        assert _parent_of(daemon.pid) == holder_pid
        client.send(Frame.KILL, struct.pack(">I", 300))
        wait_until(lambda: not daemon.is_alive(), timeout=10)
    finally:
        end(holder_pid)
        if daemon is not None:
            daemon.signal(signal.SIGKILL)


async def test_ending_a_held_shell_ends_its_daemons_below_the_holder_without_a_session_pass(monkeypatch):
    """Ending a held shell finds its tree below the holder (a few reads), not by a pass over every process
    on the host for its session (which cost each of 5,000 sessions closed at once as much as the host has
    processes); one pass without sessions still looks for strays that carry the marker."""
    from terminals.backends import procfs

    passes = []
    read = procfs.ProcessTable.read
    monkeypatch.setattr(
        procfs.ProcessTable,
        "read",
        staticmethod(lambda with_sessions=True: passes.append(with_sessions) or read(with_sessions)),
    )
    process = await LocalBackend().spawn(SpawnSpec(argv=("/bin/sh", "-c", LEAVES_EVERY_NET)), make_tags())
    seen = await read_until(process, b"-up")
    daemon = ProcessIdentity.of(int(re.search(rb"daemon-(\d+)-up", seen).group(1)))
    holder = process.handle.holder.process
    try:
        assert process.handle.holder.subreaper
        assert _parent_of(daemon.pid) == holder.pid
        reading = asyncio.ensure_future(drain(process, 20))
        exit = await asyncio.wait_for(process.terminate(grace=0.3), 20)
        assert exit.signal == signal.SIGHUP  # the program's own end: its sleep took the HUP
        assert not daemon.is_alive()
        assert passes == [False]  # the sweep for strays; no pass for the session
        await asyncio.wait_for(reading, 20)
    finally:
        daemon.signal(signal.SIGKILL)
        await process.release()


def test_serve_says_whether_its_holder_is_a_subreaper_and_an_answer_of_another_shape_is_refused():
    from terminals.backends.base import BackendError
    from terminals.backends.holder_wire import parse_started

    assert parse_started("holder 10 20 program 11 21 subreaper\n").subreaper
    assert not parse_started("holder 10 20 program 11 21\n").subreaper  # a holder built before: by marker
    for text in ("holder 10 20 program 11 21 extra", "error no PTY", "", "holder 10 20 program 11"):
        with pytest.raises(BackendError, match="did not start"):
            parse_started(text)


# --- docker: the holder inside the container ---------------------------------------------------------


def _docker_spawner(container: str, *argv: str) -> tuple[subprocess.Popen, DockerHandle]:
    spawner = subprocess.Popen(
        [sys.executable, "-m", "tests.backends.spawner", "docker", json.dumps({"container": container}), *argv],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    line = spawner.stdout.readline()
    assert line, "the spawner printed no handle"
    return spawner, load(json.loads(line))


async def test_a_held_docker_shell_outlives_the_process_that_started_it_and_another_attaches_to_it(container):
    """No docker exec can be attached again; the holder can: after its starter's SIGKILL (and the drop of
    every stream it had), another process attaches, finds the same shell and all its output, and reads the
    exit the holder recorded."""
    spawner, handle = _docker_spawner(container, "/bin/sh", "-c", "echo pid-$$; read line; echo got-$line; exit 5")
    spawner.send_signal(signal.SIGKILL)
    spawner.wait()
    assert handle.holder is not None
    backend = DockerBackend(container=container)
    seen = await backend.inspect(handle)
    assert seen.status.value == "alive" and seen.held, seen
    process = await backend.attach(handle)
    assert process.pid == handle.holder.program
    await process.write(b"xyz\n")
    output = await drain(process)
    assert f"pid-{process.pid}".encode() in output and b"got-xyz" in output
    exit = await process.wait()
    assert (exit.code, exit.signal, exit.source) == (5, None, "the session holder's record")
    await process.release()
    assert (await backend.inspect(handle)).status.value == "gone"  # released: nothing of it is left
    assert await settled_exec_processes(container) == []


async def test_a_signal_death_in_a_container_is_recorded_as_the_signal(container):
    process = await DockerBackend(container=container).spawn(
        SpawnSpec(argv=("/bin/sh", "-c", "kill -9 $$")), make_tags()
    )
    await drain(process)
    exit = await process.wait()
    assert (exit.code, exit.signal, exit.ambiguous) == (None, 9, False)
    assert exit.describe() == "Ended by signal 9"
    await process.release()


async def test_the_holder_is_copied_once_checked_by_digest_and_replaced_when_it_differs(container, binary):
    from terminals.backends import docker_held

    docker_held._installed.clear()
    first = await DockerBackend(container=container).spawn(SpawnSpec(argv=("true",)), make_tags())
    path = first.handle.holder.binary
    assert path.startswith("/tmp/.tether/holder-") and path.endswith(
        hashlib.sha256(binary.read_bytes()).hexdigest()[:16]
    )
    await drain(first)
    await first.release()
    # Someone wrote over it: the next worker (no memory of the copy) checks it and puts ours back.
    subprocess.run(["docker", "exec", container, "sh", "-c", f"echo tampered > {path}"], check=True)
    docker_held._installed.clear()
    second = await DockerBackend(container=container).spawn(SpawnSpec(argv=("sh", "-c", "echo fine")), make_tags())
    assert b"fine" in await drain(second)
    assert (await second.wait()).code == 0
    await second.release()
    listed = subprocess.run(["docker", "exec", container, "ls", "/tmp/.tether"], capture_output=True, text=True)
    assert [name for name in listed.stdout.split() if name.startswith("holder-")] == [path.rsplit("/", 1)[1]]


async def test_ctrl_p_ctrl_q_reach_a_held_docker_shell_instead_of_detaching_it(container):
    """Docker reads Ctrl-P Ctrl-Q on an exec's stdin as "detach"; typed into a held shell, they are input."""
    process = await DockerBackend(container=container).spawn(
        SpawnSpec(argv=("/bin/sh", "-c", "stty raw -echo; od -An -tx1 -N4; exit 0")), make_tags()
    )
    await asyncio.sleep(0.5)  # stty has run
    await process.write(b"\x10\x11\x10a")
    output = await drain(process)
    assert b"10 11 10 61" in output, output
    assert (await process.wait()).code == 0
    await process.release()


async def test_where_the_holder_cannot_run_a_plain_exec_is_started_and_says_so():
    """A read-only root filesystem (no writable /tmp): the shell still starts, as a plain exec that will not
    outlive its worker, and its handle says why."""
    from tests.bridge.harness import TEST_IMAGE

    name = f"tether-test-ro-{secrets.token_hex(4)}"
    options = ["--rm", "--read-only", "--network", "none", "--label", "tether.test=1", "--name", name]
    subprocess.run(
        ["docker", "run", "-d", *options, TEST_IMAGE, "sleep", "2147483647"], check=True, capture_output=True
    )
    try:
        process = await DockerBackend(container=name).spawn(SpawnSpec(argv=("sh", "-c", "echo plain")), make_tags())
        assert process.handle.holder is None and "cannot" in process.handle.unheld, process.handle
        assert b"plain" in await drain(process)
        assert not process.survives_owner
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True)


async def test_a_held_docker_shell_whose_container_was_removed_is_gone_with_no_exit_made_up():
    """The one case with neither an observed exit nor a record: the container, and the holder's record in it,
    went together. Recovery then records unknown, never an exit."""
    from tests.bridge.harness import start_container

    name, error = start_container()
    assert name, error
    try:
        process = await DockerBackend(container=name).spawn(SpawnSpec(argv=("sh", "-c", "sleep 1000")), make_tags())
        handle = process.handle
        await process.detach()
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True)
    seen = await DockerBackend(container=name).inspect(handle)
    assert (seen.status.value, seen.exit, seen.held) == ("gone", None, False), seen
    assert "is gone" in seen.detail


def _signals(pid: int) -> tuple[int, int]:
    """(ignored, blocked) signal sets of ``pid``, as masks (bit N-1 for signal N)."""
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
    return int(fields["SigIgn"], 16), int(fields["SigBlk"], 16)


def test_the_program_ignores_and_blocks_no_signal_whatever_its_starter_did(binary):
    """A worker started as a script's background job ignores SIGINT and SIGQUIT, and an ignored signal outlives
    exec: every shell it held then ignored Ctrl-C (seen in full runs started that way: `sleep` ran on). The
    holder gives its program every signal as a terminal's program has it; so does the mux."""

    def ignoring():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGQUIT, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})

    place = Path(HELD_DIR) / f"raw-{secrets.token_hex(6)}"
    Path(HELD_DIR).mkdir(mode=0o700, exist_ok=True)
    secret = secrets.token_hex(24)
    answer = subprocess.run(
        [str(binary), "serve", str(place), "--", "sleep", "100"],
        input=f"{secret}\n".encode(), capture_output=True, timeout=30, check=True, preexec_fn=ignoring,
    ).stdout.split()  # fmt: skip
    holder, program = int(answer[1]), int(answer[4])
    try:
        # Read once it runs its program: between the fork and the exec the child still has the holder's mask (and
        # musl's, which blocks every signal around fork: seen in full runs under load). `sleep` itself sets none.
        deadline = time.monotonic() + 10
        while Path(f"/proc/{program}/comm").read_text().strip() != "sleep" and time.monotonic() < deadline:
            time.sleep(0.01)
        wanted = (1 << (signal.SIGINT - 1)) | (1 << (signal.SIGQUIT - 1)) | (1 << (signal.SIGUSR1 - 1))
        ignored, blocked = _signals(program)
        assert (ignored | blocked) & wanted == 0, (hex(ignored), hex(blocked))
    finally:
        end(holder)
    mux = subprocess.Popen(
        [str(binary), "mux", "--", "/bin/sh", "-c", "grep -E '^Sig(Ign|Blk)' /proc/self/status"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, preexec_fn=ignoring,
    )  # fmt: skip
    out, _ = mux.communicate(timeout=30)
    lines = [base64.b64decode(line.split(b":", 1)[1]) for line in out.splitlines() if line[:1] == b"O"]
    said = dict(line.split(b":\t") for line in b"".join(lines).splitlines())
    assert int(said[b"SigIgn"], 16) & wanted == 0 and int(said[b"SigBlk"], 16) & wanted == 0, said


def test_a_screen_left_with_the_holder_is_given_to_the_next_client_that_asks_for_it(binary):
    """`P` leaves a screen (opaque bytes) at an offset; the next attach with `B` gets it after its answer and
    before any output; an attach with `A` gets none (an older worker never asks); `version` says `screens`."""
    assert "screens" in subprocess.run([str(binary), "version"], capture_output=True, text=True).stdout.split()
    place, secret, holder = start(binary, "/bin/sh", "-c", "printf 'one two three'; sleep 100")
    try:
        first = Raw(place)
        first.send(Frame.ATTACH_SCREEN, secret.encode() + struct.pack(">Q", 0))
        assert first.next()[0] == Frame.ATTACHED
        assert first.next() == (Frame.SCREEN, b"")  # none left yet
        first.output_until(b"three")
        first.send(Frame.SCREEN, struct.pack(">Q", 4) + b"\x1bc the screen at 4")
        first.send(Frame.ACK, struct.pack(">Q", 4))
        first.close()

        second = Raw(place)
        second.send(Frame.ATTACH_SCREEN, secret.encode() + struct.pack(">Q", 0))
        kind, payload = second.next()
        assert kind == Frame.ATTACHED and struct.unpack_from(">QQ", payload) == (4, 4)  # resumes where acked
        assert second.next() == (Frame.SCREEN, struct.pack(">Q", 4) + b"\x1bc the screen at 4")
        assert second.output_until(b"three") == b"two three"
        second.close()

        third = Raw(place)
        assert third.attach(secret)[0] == 4
        assert third.next() == (Frame.OUTPUT, struct.pack(">Q", 4) + b"two three")  # no screen frame
        third.close()
    finally:
        end(holder)
