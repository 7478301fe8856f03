"""The tmux backend: each program runs in a detached session on a dedicated tmux socket.

The session outlives its owner worker, so a later worker can adopt it (``attach``) or clean it up
(``list_tagged`` + ``remove``). Output is streamed through a control-mode client (``tmux -C``) and
input goes back as ``send-keys -H``; nobody's screen is scraped. The pane's first process is
``tmux_shim.py``, which keeps tmux from dropping the last output when the program exits and reports
the exit (see there).

Backpressure, measured on tmux 3.3a. tmux stops reading a pane whose only clients are control clients
holding 512+ bytes of unwritten output, but it refills that output only after a write to the client
succeeds. When the pipe to us fills while fewer than 512 bytes are queued, tmux goes on reading the
pane and keeps everything for the client: with a stalled reader, a writer ran on in 6 of 6 tries
(reading 64 KiB at a time) and 1 of 8 (this module's reads), the server growing by 5-15 MiB/s (to
~100 MiB within 6 s). ``pause-after`` and ``refresh-client -A %pane:off`` (per tmux's source) make
tmux read on and discard. So when the consumer has not asked for output for ``STALL_AFTER``, the
pane's terminal is stopped with ``tcflow(TCOOFF)``: the writer blocks in write(), tmux stays within a
few MiB (15 of 15 tries), and the next ``read()`` starts it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pwd
import re
import shutil
import sys
import termios
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from signal import SIGTERM

from terminals.backends import procfs
from terminals.backends.base import (
    READ_CHUNK,
    Backend,
    BackendError,
    BeforeStart,
    Exit,
    Inspection,
    Process,
    SpawnError,
    SpawnSpec,
    Status,
    TaggedSession,
    Tags,
    child_env,
)
from terminals.backends.tmux_control import ControlClient, Event, Sentinel
from terminals.backends.tmux_shim import SENTINEL, SHIM_MARKER_VARIABLE

log = logging.getLogger(__name__)

SHIM = Path(__file__).with_name("tmux_shim.py")
STALL_AFTER = 0.1
SHIM_GRACE = 2.0  # seconds the shim may take to record the exit and end once the program's tree is gone
PAUSE_AFTER = 300  # seconds; without it tmux drops a control client that is 5 minutes behind
SEND_KEYS_BATCH = 1024
FORCED_BY_TMUX = ("TERM", "TERM_PROGRAM", "TERM_PROGRAM_VERSION", "TMUX", "TMUX_PANE", "SHELL")
GONE_ERRORS = ("no server running", "error connecting", "can't find", "no such session", "server exited")
TAGS = ("session", "owner_pid", "owner_started_at", "heartbeat", "marker")
SESSION_OPTIONS = {"status": "off", "destroy-unattached": "off", "detach-on-destroy": "on"}
# window-size manual: the control client never resizes the window (set globally, it crashes tmux 3.3a).
WINDOW_OPTIONS = {
    "window-size": "manual",
    "remain-on-exit": "on",
    "automatic-rename": "off",
    "allow-rename": "off",
    "monitor-bell": "off",
}
SERVER_FORMAT = "#{socket_path}:#{pid}@#{start_time}"
STATE = "#{pane_id}|#{pane_pid}|#{pane_tty}|#{pane_dead}|#{pane_dead_status}|#{pane_dead_signal}|#{@tether_exit}"


@dataclass(frozen=True)
class Snapshot:
    screen: bytes  # capture-pane -p -e -J: the visible screen with its SGR escapes, wrapped lines joined
    cursor_x: int
    cursor_y: int
    cols: int
    rows: int

    def render(self) -> bytes:
        """Bytes that draw this screen on a terminal of the same size, cursor included. Blank lines first
        scroll whatever was shown before into the scrollback, so nothing earlier is wiped."""
        return (
            b"\x1b[0m"
            + b"\r\n" * self.rows
            + b"\x1b[H"
            + b"\r\n".join(self.screen.split(b"\n")[: self.rows])
            + f"\x1b[0m\x1b[{self.cursor_y + 1};{self.cursor_x + 1}H".encode()
        )


@dataclass(frozen=True)
class PaneState:
    status: Status
    ours: bool = False  # the pane id, session name and marker all matched
    exit: Exit | None = None
    pid: int = 0
    tty: str = ""
    program_ended: bool = False  # the shim recorded the program's exit (it may still wait to be released)
    detail: str = ""


def session_name(tags: Tags) -> str:
    # tmux session names cannot hold ':' or '.'; the marker keeps a respawned session apart.
    return f"{re.sub(r'[^A-Za-z0-9_-]', '_', tags.session)[:48]}-{tags.marker[:8]}"


def _exit_from(recorded: str) -> Exit | None:
    """The program's exit as the shim recorded it. tmux's own pane_dead_status / pane_dead_signal are the
    shim's: they equal the program's only when the shim ran to its end, and then it had recorded the exit
    first. Without a record they tell how the shim ended (killed, crashed), not the program."""
    kind, _, number = recorded.partition(":")
    if kind == "code" and number.isdigit():
        return Exit(code=int(number), source="tmux_shim waitpid (tmux @tether_exit)")
    if kind == "signal" and number.isdigit():
        return Exit(signal=int(number), source="tmux_shim waitpid (tmux @tether_exit)")
    return None


def _chain(commands: list[list[str]]) -> list[str]:
    """One tmux command line running ``commands`` in order, stopping at the first that fails."""
    # tmux ends a command at any argument ending in ';' unless it ends in '\\;'.
    quoted = [[f"{arg[:-1]}\\;" if arg.endswith(";") else arg for arg in command] for command in commands]
    return [arg for command in quoted for arg in (*command, ";")][:-1]


def _end_go_wait(marker: str) -> None:
    """End the tmux client through which a shim waits for its go: the shim then exits, starting nothing."""
    gate = f"tether-go-{marker}".encode()
    for waiter in procfs.find_tree(marker=marker, variable=SHIM_MARKER_VARIABLE):
        try:
            argv = Path(f"/proc/{waiter.pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if gate in argv:
            waiter.signal(SIGTERM)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _tty_of(pid: int) -> int | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(raw[raw.rindex(")") + 2 :].split()[4])


class TmuxProcess(Process):
    can_snapshot = True

    def __init__(self, backend: TmuxBackend, handle: dict, state: PaneState):
        self.handle = handle
        self._backend = backend
        self._pane = handle["pane"]
        self._tty = state.tty
        self._shim = procfs.ProcessIdentity.of(state.pid) if state.pid else None
        self._client: ControlClient | None = None
        self._replies: list[Callable[[Event], None] | None] = []
        self._ready = bytearray()
        self._sentinel = Sentinel(SENTINEL % handle["marker"].encode())
        self._ended = False
        self._dead_checks = 0
        self._stall: asyncio.TimerHandle | None = None
        self._stopped = False
        self._exit: Exit | None = None
        self._watching: asyncio.Future | None = None

    async def _open(self) -> None:
        argv = [*self._backend._argv(), "-u", "-C", "attach-session", "-t", f"={self.handle['session']}"]
        try:
            self._client = await ControlClient.start(argv, self._backend._env)
        except OSError as error:
            raise BackendError(f"cannot run tmux: {error}") from None
        # Commands on stdin may run before the attach itself: wait until the client is in the session.
        try:
            async with asyncio.timeout(10):
                while (event := await self._client.reader.next()) is not None:
                    if event.kind == "reply" and event.error:
                        break
                    if event.kind == "other" and event.lines[0].startswith("%session-changed"):
                        break
        except TimeoutError:
            event = None
        if event is None or event.kind != "other":
            await self._client.close()
            raise BackendError(f"cannot attach to {self.handle['session']}: {' '.join(event.lines if event else [])}")
        self._send(f"refresh-client -f pause-after={PAUSE_AFTER}")
        self._send("refresh-client -B 'tether-dead::#{pane_dead}'")  # pane subscriptions skip dead panes

    def _send(self, command: str, reply: Callable[[Event], None] | None = None, *, quiet: bool = False) -> None:
        if self._client is None or not self._client.open:
            if quiet:  # bookkeeping of a stream that is being closed
                return
            raise BackendError(f"the tmux control client of {self.handle['session']} is closed")
        self._client.send(command)
        self._replies.append(reply)

    async def read(self) -> bytes:
        self._resume()
        if self._client is None:
            return b""
        try:
            waited = False
            reader = self._client.reader
            # Parse what is already here up to a full chunk, but touch the pipe only when there is nothing.
            while not self._ended and len(self._ready) < READ_CHUNK:
                if not reader.buffered():
                    if self._ready:
                        break
                    waited = True
                self._handle(await reader.next())
            if not waited:
                await asyncio.sleep(0)  # data was already here: a fast producer must not starve the loop
        finally:
            if not self._ended:
                self._stall = asyncio.get_running_loop().call_later(STALL_AFTER, self._flow, termios.TCOOFF)
        if self._ended and not self._ready:
            await self.detach()  # the pane is dead and everything was read: free the client
        chunk = bytes(self._ready[:READ_CHUNK])
        del self._ready[:READ_CHUNK]
        return chunk

    def _handle(self, event: Event | None) -> None:
        if event is None or event.kind == "exit":
            self._end()
        elif event.kind == "output" and event.pane == self._pane:
            self._ready += self._sentinel.feed(event.data)
            if self._sentinel.seen and self._dead_checks == 0:
                # All the program's output is here: let the shim end, then confirm the pane is dead.
                self._unlock("release")
                self._check_dead()
        elif event.kind == "reply" and event.ours:
            reply = self._replies.pop(0) if self._replies else None
            if reply is not None:
                reply(event)
            elif event.error:
                log.warning("tmux %s: %s", self.handle["session"], " ".join(event.lines))
        elif event.kind == "subscription" and event.pane == "tether-dead" and event.lines[0].startswith("1"):
            self._check_dead()
        elif event.kind == "pause" and event.pane == self._pane:
            log.warning("tmux paused %s after %ss behind; output was lost", self.handle["session"], PAUSE_AFTER)
            self._send(f"refresh-client -A '{self._pane}:continue'", quiet=True)

    def _unlock(self, gate: str) -> None:
        """Open one of the shim's gates; opening it twice is harmless (tmux says it is not locked)."""
        self._send(f"wait-for -U tether-{gate}-{self.handle['marker']}", lambda reply: None, quiet=True)

    def _check_dead(self) -> None:
        """Ask whether the pane is dead; the reply comes after every line written before it."""
        if self._ended or self._client is None or not self._client.open:
            return
        self._dead_checks += 1
        self._send(f"display -p -t {self._pane} '#{{pane_dead}}'", self._dead_reply, quiet=True)

    def _dead_reply(self, reply: Event) -> None:
        if reply.lines[:1] == ["1"]:
            self._end()
        elif self._sentinel.seen and self._dead_checks < 250:  # the shim ends at once; a forged sentinel not
            asyncio.get_running_loop().call_later(0.02, self._check_dead)

    def _end(self) -> None:
        if not self._ended:
            self._ended = True
            self._ready += self._sentinel.flush()

    def _resume(self) -> None:
        if self._stall is not None:
            self._stall.cancel()
            self._stall = None
        if self._stopped:
            self._flow(termios.TCOON)

    def _flow(self, action: int) -> None:
        """Stop or start the pane's terminal output, only while its tty is still the shim's."""
        self._stall = None
        if self._shim is None or not self._shim.is_alive() or not self._tty:
            self._stopped = False
            return
        try:
            fd = os.open(self._tty, os.O_RDWR | os.O_NOCTTY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return
        try:
            if os.fstat(fd).st_rdev == _tty_of(self._shim.pid):  # a pts number can be reused
                termios.tcflow(fd, action)
                self._stopped = action == termios.TCOOFF
        except OSError as error:
            log.warning("tmux %s: tcflow failed: %s", self.handle["session"], error)
        finally:
            os.close(fd)

    async def write(self, data: bytes) -> None:
        for start in range(0, len(data), SEND_KEYS_BATCH):
            self._send(f"send-keys -H -t {self._pane} {data[start : start + SEND_KEYS_BATCH].hex(' ')}")
        await self._drain()

    async def resize(self, cols: int, rows: int) -> None:
        """Returns once tmux has resized the window, so a snapshot taken next is of the new grid."""
        done = asyncio.get_running_loop().create_future()
        self._send(
            f"resize-window -t {self._pane} -x {int(cols)} -y {int(rows)}",
            lambda reply: done.done() or done.set_result(reply),
        )
        await self._drain()
        with contextlib.suppress(TimeoutError):  # the reply comes in line with output the pump reads
            await asyncio.wait_for(asyncio.shield(done), 2)

    async def _drain(self) -> None:
        try:
            await self._client.drain()
        except OSError as error:
            raise BackendError(str(error)) from None

    async def wait(self) -> Exit:
        if self._watching is None:
            self._watching = asyncio.ensure_future(self._watch())
        return await asyncio.shield(self._watching)

    async def _watch(self) -> Exit:
        while self._exit is None:
            state = await self._backend._state(self.handle)
            if self._exit is not None:  # terminate() read it meanwhile, before it removed the session
                break
            if state.exit is None and state.status != Status.ALIVE:
                raise BackendError(f"no exit can be known for {self.handle['session']}: {state.detail}")
            self._exit = state.exit
            if self._exit is None:
                # The shim wakes this channel; the timeout covers a session killed from outside.
                await self._backend._run("wait-for", f"tether-exit-{self.handle['marker']}", timeout=10)
        return self._exit

    async def terminate(self, grace: float = 2.0) -> Exit | None:
        # Without a control client tmux reads the pane freely, so the shim can write its sentinel and end.
        await self.detach()
        await self._backend._end_tree(self.handle, grace)
        exit = self._exit
        for _ in range(100):
            state = await self._backend._state(self.handle)
            exit = state.exit or exit
            if exit is not None or state.status != Status.ALIVE:
                break
            await asyncio.sleep(0.02)
        # Kept before the session (tmux's record of the exit) goes: a wait() woken by the exit reads it here.
        self._exit = exit
        await self._backend._run("kill-session", "-t", f"={self.handle['session']}")
        return exit

    async def detach(self) -> None:
        self._resume()
        self._ended = True
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    async def snapshot(self) -> Snapshot:
        return await self._backend.snapshot(self.handle)


class TmuxBackend(Backend):
    name = "tmux"
    can_adopt = True

    def __init__(self, socket: str = "tether"):
        self.socket = socket
        self._tmux = shutil.which("tmux") or "tmux"
        # A clean environment: the server copies it into every pane otherwise.
        self._env = {"LANG": "C.UTF-8", **{k: os.environ[k] for k in ("TMUX_TMPDIR",) if k in os.environ}}

    def _handle(self, session: str, pane: str, marker: str) -> dict:
        return {"backend": "tmux", "socket": self.socket, "session": session, "pane": pane, "marker": marker}

    def _argv(self) -> list[str]:
        return [self._tmux, "-L", self.socket, "-f", "/dev/null"]

    async def _exec(self, *args: str, **streams) -> asyncio.subprocess.Process:
        try:
            return await asyncio.create_subprocess_exec(*self._argv(), *args, env=self._env, **streams)
        except OSError as error:
            raise BackendError(f"cannot run tmux: {error}") from None

    async def _run(self, *args: str, timeout: float = 30) -> tuple[int, str, str]:
        pipe = asyncio.subprocess.PIPE
        process = await self._exec(*args, stdin=asyncio.subprocess.DEVNULL, stdout=pipe, stderr=pipe)
        try:
            out, err = await asyncio.wait_for(process.communicate(), timeout)
        except TimeoutError:
            process.kill()
            await process.wait()
            return -1, "", "timed out"
        return process.returncode, out.decode(errors="replace"), err.decode(errors="replace")

    async def _state(self, handle: dict) -> PaneState:
        fmt = f"{STATE}|#{{@tether_marker}}|#{{session_name}}|#{{pid}}"
        try:
            code, out, err = await self._run("display-message", "-p", "-t", handle["pane"], fmt)
        except BackendError as error:
            return PaneState(Status.UNKNOWN, detail=str(error))
        if code != 0:
            gone = any(text in err for text in GONE_ERRORS)
            return PaneState(Status.GONE if gone else Status.UNKNOWN, detail=err.strip() or f"tmux exited {code}")
        fields = out.rstrip("\n").split("|", 9)
        # display-message falls back to another pane, or to none, when the target is missing.
        if len(fields) < 10 or (fields[0], fields[7], fields[8]) != (
            handle["pane"],
            handle["marker"],
            handle["session"],
        ):
            return PaneState(Status.GONE, detail=f"no pane {handle['pane']} of session {handle['session']}")
        _, pid, tty, dead, status, signal, recorded = fields[:7]
        exit = _exit_from(recorded)
        if exit is not None:
            verdict, detail = Status.EXITED, exit.describe()
        elif dead == "1":
            if (
                not (status or signal or not pid.isdigit())
                and (ended := procfs.zombie_status(int(pid), int(fields[9]))) is not None
            ):
                # tmux 3.3a can miss the SIGCHLD under load and leave the shim unreaped: the zombie says it.
                status, signal = (
                    ("", str(os.WTERMSIG(ended))) if os.WIFSIGNALED(ended) else (str(os.WEXITSTATUS(ended)), "")
                )
            shim = f"by signal {signal}" if signal else f"with code {status}" if status else "without a status"
            verdict, detail = Status.UNKNOWN, f"the pane's shim ended {shim} before it recorded the program's exit"
        else:
            verdict, detail = Status.ALIVE, ""
        # A dead pane's pid may already name another process.
        pid_if_alive = int(pid) if dead == "0" else 0
        return PaneState(verdict, True, exit, pid_if_alive, tty, program_ended=bool(recorded), detail=detail)

    async def spawn(
        self, spec: SpawnSpec, tags: Tags, before_start: BeforeStart | None = None, instance: str = ""
    ) -> TmuxProcess:
        # No handle is needed before the program starts: a session is found again by its marker, and its
        # shim starts the program only at the owner's go (see tmux_shim).
        account = pwd.getpwuid(os.getuid())
        env = child_env(spec, tags, {"HOME": account.pw_dir, "USER": account.pw_name, "SHELL": account.pw_shell})
        program, cwd = spec.argv[0], spec.cwd or account.pw_dir
        if not os.path.isdir(cwd):
            raise SpawnError(f"working directory does not exist: {cwd}")
        if shutil.which(program if "/" not in program else os.path.join(cwd, program), path=env["PATH"]) is None:
            raise SpawnError(f"program not found: {program}")
        fixes = [
            x
            for name in FORCED_BY_TMUX
            for x in (("--set", f"{name}={env[name]}") if name in env else ("--unset", name))
        ]
        name, target = session_name(tags), f"={session_name(tags)}:"
        shim = [sys.executable, "-I", "-S", str(SHIM), self._tmux, *fixes, "--", *spec.argv]
        options = {**SESSION_OPTIONS, **{f"@tether_{key}": str(value) for key, value in asdict(tags).items()}}
        size = ["-x", str(spec.cols), "-y", str(spec.rows)]
        # The shim carries the marker under its own name and hands it to the program (see tmux_shim).
        env[SHIM_MARKER_VARIABLE] = env.pop(procfs.MARKER_VARIABLE)
        env_args = [x for key, value in env.items() for x in ("-e", f"{key}={value}")]
        create = ["new-session", "-d", "-s", name, *size, "-c", cwd.replace("#", "##")]
        commands = [
            ["start-server"],
            # A server that exits with its last session races the next spawn on the same socket (the
            # churn benchmark hit "server exited unexpectedly"): keep it up; it costs one idle process.
            ["set-option", "-s", "exit-empty", "off"],
            ["set-option", "-s", "escape-time", "0"],
            ["set-option", "-g", "update-environment", ""],
            # Printed: the pane, and the server it was made in (a server restarted since instance() is another).
            [*create, *env_args, "-P", "-F", f"#{{pane_id}} {SERVER_FORMAT}", "--", *shim],
            # The shim's gates. This list runs before any other client's command, so before the shim asks;
            # a lock, unlike a signal, is never lost or undone by a second wake.
            *(["wait-for", "-L", f"tether-{gate}-{tags.marker}"] for gate in ("go", "release")),
            *(["set-option", "-t", target, option, value] for option, value in options.items()),
            *(["set-option", "-w", "-t", target, option, value] for option, value in WINDOW_OPTIONS.items()),
        ]
        for _ in range(3):
            code, out, err = await self._run(*_chain(commands))
            if "server exited" not in err:
                break
            # Another client's kill-server (or an exiting server of an older Tether) took our command
            # list with it: nothing of ours survived it, so asking the next server is safe.
            await asyncio.sleep(0.1)
        if not out.startswith("%"):  # no session was made (a failed command list stops at the failure)
            raise SpawnError(f"tmux could not start {program}: {err.strip() or out.strip()}")
        pane, _, server = out.strip().partition(" ")
        handle = self._handle(name, pane, tags.marker) | {"instance": server}
        try:
            if code != 0:
                raise BackendError(f"tmux could not set up {name}: {err.strip()}")
            return await self._adopt(handle)
        except BackendError as error:
            await self._end_tree(handle, 0.5)
            await self._run("kill-session", "-t", f"={name}")
            raise SpawnError(str(error)) from None

    async def _adopt(self, handle: dict) -> TmuxProcess:
        state = await self._state(handle)
        if state.status not in (Status.ALIVE, Status.EXITED):
            raise BackendError(f"cannot attach to {handle['session']}: {state.detail}")
        process = TmuxProcess(self, handle, state)
        await process._open()
        process._flow(termios.TCOON)  # a dead owner may have left the terminal stopped
        # Start the program if the old owner died before it did; a spare unlock is harmless.
        process._unlock("go")
        if (await self._state(handle)).program_ended:
            # Its sentinel may have gone to nobody: release the shim once what reached us was read.
            process._send("display -p synced", lambda reply: process._unlock("release"))
        await process._drain()
        return process

    async def attach(self, handle: dict) -> TmuxProcess:
        return await self._adopt(handle)

    async def inspect(self, handle: dict) -> Inspection:
        state = await self._state(handle)
        return Inspection(state.status, state.exit, state.detail)

    async def inspect_launch(self, intent: dict) -> Inspection:
        """A session tagged with the intent's marker is the one its owner made: look at that. None, on the
        same server as then, nothing carrying the marker, and no tmux client of the dead owner's still making
        one: it never started."""
        for tagged in await self.list_tagged():
            if tagged.tags["marker"] == intent["marker"]:
                seen = await self.inspect(tagged.handle)
                return Inspection(seen.status, seen.exit, seen.detail, handle=tagged.handle)
        if left := await self.survivors(intent):
            # A session made without its tags (its creation cut short) may run the program unsupervised.
            return Inspection(Status.GONE, detail=f"no session holds it, but {left} process(es) carry its marker")
        now = await self.instance()
        server = int(now.rpartition(":")[2].partition("@")[0]) if now else 0  # a server keeps its client's argv
        clients = [c for c in await asyncio.to_thread(procfs.find_by_cmdline, intent["marker"]) if c.pid != server]
        if clients:
            return Inspection(Status.UNKNOWN, detail=f"tmux client pid {clients[0].pid} may still be creating it")
        if now and now == intent.get("instance"):
            return Inspection(
                Status.NEVER_STARTED, detail=f"no session carries its marker on tmux server {now}, where it was to run"
            )
        then = intent.get("instance") or "not recorded"
        return Inspection(
            Status.GONE, detail=f"no session carries its marker, but the tmux server is {now or 'gone'} (was {then})"
        )

    def socket_path(self) -> str:
        """Where this process's tmux looks for the socket (its uid and TMUX_TMPDIR decide, as tmux's own)."""
        root = os.environ.get("TMUX_TMPDIR") or "/tmp"
        return os.path.realpath(os.path.join(root, f"tmux-{os.getuid()}", self.socket))

    async def instance(self, *, ensure: bool = False) -> str:
        """The server as ``SOCKET-PATH:pid@start time``: a restarted server is another one, its sessions gone,
        and a server at another path (another user's, another TMUX_TMPDIR) is no server of ours."""
        setup = ["start-server", ";", "set-option", "-s", "exit-empty", "off", ";"] if ensure else []
        code, out, err = await self._run(*setup, "display-message", "-p", SERVER_FORMAT)
        if code == 0:
            return out.strip()
        if not ensure and any(text in err for text in GONE_ERRORS):
            return ""
        raise BackendError(f"cannot reach the tmux server on socket {self.socket}: {err.strip() or code}")

    async def vacancy(self, instance: str) -> str | None:
        path, _, server = instance.rpartition(":")
        if path and os.path.realpath(path) != self.socket_path():
            raise BackendError(
                f"its tmux socket is {path}, but this process would look at {self.socket_path()}: "
                "look as the workers' user, with their TMUX_TMPDIR"
            )
        now = await self.instance()
        if instance and now == instance:
            return None  # the same server runs: its session decides
        if instance:
            pid = int(server.partition("@")[0] or 0)
            if pid and b"tmux" in _cmdline(pid):
                return None  # the old server still runs (its socket was removed): no proof from here
            return f"the tmux server it ran in ({server}) is gone, and every session it held"
        if not now:
            return f"no tmux server runs on socket {self.socket}: every session it held is gone"
        return None

    async def survivors(self, handle: dict) -> int:
        """Processes of its program's tree, and its shim (alive while its pane is): by their markers."""
        marker = handle["marker"]
        program = await asyncio.to_thread(procfs.find_tree, marker=marker)
        shim = await asyncio.to_thread(procfs.find_tree, marker=marker, variable=SHIM_MARKER_VARIABLE)
        return len(program) + len(shim)

    async def list_tagged(self) -> list[TaggedSession]:
        fmt = "|".join(["#{session_name}", "#{pane_id}", *(f"#{{@tether_{key}}}" for key in TAGS)])
        code, out, _ = await self._run("list-sessions", "-F", fmt)
        found = []
        for line in out.splitlines() if code == 0 else []:
            name, pane, *values = line.split("|")
            tags = dict(zip(TAGS[1:], values[-4:], strict=True))
            tags["session"] = "|".join(values[:-4])  # the free-text field, in case it holds the separator
            if tags["session"] and tags["marker"]:
                found.append(TaggedSession(handle=self._handle(name, pane, tags["marker"]), tags=tags))
        return found

    async def tag(self, handle: dict, **values: str | int) -> None:
        """Update owner tags (owner_pid, owner_started_at, heartbeat), e.g. by the worker that adopted it."""
        if not (await self._state(handle)).ours:
            raise BackendError(f"no session {handle['session']} to tag")
        commands = [
            ["set-option", "-t", f"={handle['session']}:", f"@tether_{key}", str(value)]
            for key, value in values.items()
        ]
        code, _, err = await self._run(*_chain(commands))
        if code != 0:
            raise BackendError(f"could not tag {handle['session']}: {err.strip()}")

    async def _end_tree(self, handle: dict, grace: float, state: PaneState | None = None) -> None:
        """End the program's tree, then the shim once it has recorded the exit.

        1. open the shim's release gate, so it ends as soon as it has recorded how the program ended;
        2. end the program's tree (SIGHUP/SIGTERM, SIGKILL after ``grace``), which the shim is not part of;
        3. if there was no program, end the shim's wait for the go (it then exits without starting one);
        4. give the shim ``SHIM_GRACE`` to end by itself; a shim that does not (it cannot write its
           sentinel), or was killed before it recorded an exit, is ended with its helpers.
        """
        state = state or await self._state(handle)
        shim = None
        if state.pid and procfs._has_marker(state.pid, handle["marker"], SHIM_MARKER_VARIABLE):
            shim = procfs.ProcessIdentity.of(state.pid)  # checked: tmux may have reaped it, freeing the pid
        await self._run("wait-for", "-U", f"tether-release-{handle['marker']}")
        ended = await procfs.terminate_tree(marker=handle["marker"], grace=grace)
        no_program = not ended and not state.program_ended
        until = asyncio.get_running_loop().time() + SHIM_GRACE
        while shim is not None and shim.is_alive() and asyncio.get_running_loop().time() < until:
            if no_program:  # a shim just started may reach its gate only now
                await asyncio.to_thread(_end_go_wait, handle["marker"])
            await asyncio.sleep(0.02)
        if (shim is not None and shim.is_alive()) or (state.status != Status.ALIVE and not state.program_ended):
            await procfs.terminate_tree(marker=handle["marker"], variable=SHIM_MARKER_VARIABLE, grace=0)

    async def remove(self, handle: dict, grace: float = 2.0) -> None:
        if "pane" not in handle:  # an intent whose session was never found: only processes by their markers
            await procfs.terminate_tree(marker=handle["marker"], grace=grace)
            await procfs.terminate_tree(marker=handle["marker"], variable=SHIM_MARKER_VARIABLE, grace=0)
            return
        state = await self._state(handle)
        await self._end_tree(handle, grace, state)
        if state.ours:  # never a session whose pane, name and marker do not all match
            await self._run("kill-session", "-t", f"={handle['session']}")

    async def snapshot(self, handle: dict) -> Snapshot:
        fmt = "#{pane_id}|#{@tether_marker}|#{cursor_x}|#{cursor_y}|#{pane_width}|#{pane_height}"
        target = ("-t", handle["pane"])
        code, out, err = await self._run(
            "capture-pane", "-p", "-e", "-J", *target, ";", "display-message", "-p", *target, fmt
        )
        screen, _, last = out.rstrip("\n").rpartition("\n")
        fields = last.split("|")
        if code != 0 or fields[:2] != [handle["pane"], handle["marker"]]:
            raise BackendError(f"no screen for {handle['session']}: {err.strip() or 'not this session'}")
        return Snapshot(screen.encode(), *(int(x) for x in fields[2:]))
