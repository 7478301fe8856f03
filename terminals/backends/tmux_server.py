"""One tmux server (a socket) as Tether uses it: running tmux commands on it, reading a pane's state and
screen, and ending a pane's program tree. Both the tmux backend and its processes go through this object."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from signal import SIGTERM

from terminals.backends import ending, procfs
from terminals.backends.base import BackendError, Exit, Status
from terminals.backends.handles import TmuxHandle
from terminals.backends.tmux_screen import CAPTURE, PANE_FORMAT, Snapshot, parse_pane
from terminals.backends.tmux_shim import SHIM_MARKER_VARIABLE
from terminals.children import DEVNULL, PIPE, Child

SHIM_GRACE = 2.0  # seconds the shim may take to record the exit and end once the program's tree is gone
GONE_ERRORS = ("no server running", "error connecting", "can't find", "no such session", "server exited")
SERVER_FORMAT = "#{socket_path}:#{pid}@#{start_time}"
STATE = "#{pane_id}|#{pane_pid}|#{pane_tty}|#{pane_dead}|#{pane_dead_status}|#{pane_dead_signal}|#{@tether_exit}"


@dataclass(frozen=True)
class PaneState:
    status: Status
    ours: bool = False  # the pane id, session name and marker all matched
    exit: Exit | None = None
    pid: int = 0
    tty: str = ""
    program_ended: bool = False  # the shim recorded the program's exit (it may still wait to be released)
    detail: str = ""


def exit_from(recorded: str) -> Exit | None:
    """The program's exit as the shim recorded it. tmux's own pane_dead_status / pane_dead_signal are the
    shim's: they equal the program's only when the shim ran to its end, and then it had recorded the exit
    first. Without a record they tell how the shim ended (killed, crashed), not the program."""
    kind, _, number = recorded.partition(":")
    if kind == "code" and number.isdigit():
        return Exit(code=int(number), source="tmux_shim waitpid (tmux @tether_exit)")
    if kind == "signal" and number.isdigit():
        return Exit(signal=int(number), source="tmux_shim waitpid (tmux @tether_exit)")
    return None


def chain(commands: list[list[str]]) -> list[str]:
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


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def tty_of(pid: int) -> int | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(raw[raw.rindex(")") + 2 :].split()[4])


class TmuxServer:
    def __init__(self, socket: str):
        self.socket = socket
        self.tmux = shutil.which("tmux") or "tmux"
        # A clean environment: the server copies it into every pane otherwise.
        self.env = {"LANG": "C.UTF-8", **{k: os.environ[k] for k in ("TMUX_TMPDIR",) if k in os.environ}}

    def handle(self, session: str, pane: str, marker: str) -> TmuxHandle:
        return TmuxHandle(socket=self.socket, session=session, pane=pane, marker=marker)

    def argv(self) -> list[str]:
        return [self.tmux, "-L", self.socket, "-f", "/dev/null"]

    @contextlib.asynccontextmanager
    async def turn(self, *, alone: bool = False) -> AsyncIterator[None]:
        """Take turns on this socket, across every Tether process that uses it (a lock file beside it).

        tmux 3.3a's server crashes (SIGSEGV in ``control_write``, tmux PR 4980) when a notification reaches a
        control client that is still identifying itself: a session made or killed, a window resized, another
        client attached or gone. So a control client attaches ``alone``, once the notifications already
        queued have run; whatever makes notifications (new-session, kill-session, resize-window, a control
        client closing) runs in a shared turn. Commands that notify nobody (display, capture-pane, wait-for)
        need no turn, so a ``wait-for`` that blocks for seconds never holds anyone up."""
        path = self.turn_path()
        with contextlib.suppress(OSError):  # tmux makes this directory (0700) with its first server
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as error:  # where tmux itself could not keep its socket either
            raise BackendError(f"cannot take a turn on tmux socket {self.socket}: {error}") from None
        try:
            delay = 0.001
            while True:
                try:
                    fcntl.flock(fd, (fcntl.LOCK_EX if alone else fcntl.LOCK_SH) | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    await asyncio.sleep(delay)  # turns are milliseconds long: poll, never block the loop
                    delay = min(delay * 2, 0.01)
            if alone:
                # Notifications queue on the server's global queue, which it empties before it runs any
                # client's command: once a command of ours has answered, none made before our turn is left.
                await self.run("display-message", "-p", "")
            yield
        finally:
            os.close(fd)  # and with it the lock

    async def run(self, *args: str, timeout: float = 30) -> tuple[int, str, str]:
        try:
            process = Child.start([*self.argv(), *args], env=self.env, stdin=DEVNULL, stdout=PIPE, stderr=PIPE)
        except OSError as error:
            raise BackendError(f"cannot run tmux: {error}") from None
        try:
            out, err = await asyncio.wait_for(process.communicate(), timeout)
        except BaseException as error:  # out of time, cancelled (the worker stops) or a pipe failed
            await process.end()
            if isinstance(error, TimeoutError):
                return -1, "", "timed out"
            raise
        return process.returncode, out.decode(errors="replace"), err.decode(errors="replace")

    async def state(self, handle: TmuxHandle) -> PaneState:
        fmt = f"{STATE}|#{{@tether_marker}}|#{{session_name}}|#{{pid}}"
        try:
            code, out, err = await self.run("display-message", "-p", "-t", handle.pane, fmt)
        except BackendError as error:
            return PaneState(Status.UNKNOWN, detail=str(error))
        if code != 0:
            gone = any(text in err for text in GONE_ERRORS)
            return PaneState(Status.GONE if gone else Status.UNKNOWN, detail=err.strip() or f"tmux exited {code}")
        fields = out.rstrip("\n").split("|", 9)
        # display-message falls back to another pane, or to none, when the target is missing.
        if len(fields) < 10 or (fields[0], fields[7], fields[8]) != (
            handle.pane,
            handle.marker,
            handle.session,
        ):
            return PaneState(Status.GONE, detail=f"no pane {handle.pane} of session {handle.session}")
        _, pid, tty, dead, status, signal, recorded = fields[:7]
        exit = exit_from(recorded)
        if exit is not None:
            verdict, detail = Status.EXITED, exit.describe()
        elif dead == "1":
            if not (status or signal) and pid.isdigit() and (ended := procfs.zombie_end(int(pid), int(fields[9]))):
                status, signal = ended  # tmux 3.3a can miss the SIGCHLD under load and leave the shim unreaped
            shim = f"by signal {signal}" if signal else f"with code {status}" if status else "without a status"
            verdict, detail = Status.UNKNOWN, f"the pane's shim ended {shim} before it recorded the program's exit"
        else:
            verdict, detail = Status.ALIVE, ""
        # A dead pane's pid may already name another process.
        pid_if_alive = int(pid) if dead == "0" else 0
        return PaneState(verdict, True, exit, pid_if_alive, tty, program_ended=bool(recorded), detail=detail)

    async def end_tree(self, handle: TmuxHandle, grace: float, state: PaneState | None = None) -> None:
        """End the program's tree, then the shim once it has recorded the exit.

        1. open the shim's release gate, so it ends as soon as it has recorded how the program ended;
        2. end the program's tree (SIGHUP/SIGTERM, SIGKILL after ``grace``), which the shim is not part of;
        3. if there was no program, end the shim's wait for the go (it then exits without starting one);
        4. give the shim ``SHIM_GRACE`` to end by itself; a shim that does not (it cannot write its
           sentinel), or was killed before it recorded an exit, is ended with its helpers.
        """
        state = state or await self.state(handle)
        shim = None
        if state.pid and procfs._has_marker(state.pid, handle.marker, SHIM_MARKER_VARIABLE):
            shim = procfs.ProcessIdentity.of(state.pid)  # checked: tmux may have reaped it, freeing the pid
        await self.run("wait-for", "-U", f"tether-release-{handle.marker}")
        ended = await ending.terminate_tree(marker=handle.marker, grace=grace)
        no_program = not ended and not state.program_ended
        until = asyncio.get_running_loop().time() + SHIM_GRACE
        while shim is not None and shim.is_alive() and asyncio.get_running_loop().time() < until:
            if no_program:  # a shim just started may reach its gate only now
                await asyncio.to_thread(_end_go_wait, handle.marker)
            await asyncio.sleep(0.02)
        if (shim is not None and shim.is_alive()) or (state.status != Status.ALIVE and not state.program_ended):
            await ending.terminate_tree(marker=handle.marker, variable=SHIM_MARKER_VARIABLE, grace=0)

    async def unlock(self, gate: str, marker: str) -> None:
        await self.run("wait-for", "-U", f"tether-{gate}-{marker}")

    async def kill_session(self, session: str) -> None:
        async with self.turn():  # its control clients go with it: notifications
            await self.run("kill-session", "-t", f"={session}")

    def turn_path(self) -> Path:
        """The lock file of ``turn``, beside the socket in tmux's own directory (only its user can enter)."""
        return Path(self.socket_path() + ".tether-turn")

    def socket_path(self) -> str:
        """Where this process's tmux looks for the socket (its uid and TMUX_TMPDIR decide, as tmux's own)."""
        root = os.environ.get("TMUX_TMPDIR") or "/tmp"
        return os.path.realpath(os.path.join(root, f"tmux-{os.getuid()}", self.socket))

    async def instance(self, *, ensure: bool = False) -> str:
        """The server as ``SOCKET-PATH:pid@start time``: a restarted server is another one, its sessions gone,
        and a server at another path (another user's, another TMUX_TMPDIR) is no server of ours."""
        setup = ["start-server", ";", "set-option", "-s", "exit-empty", "off", ";"] if ensure else []
        code, out, err = await self.run(*setup, "display-message", "-p", SERVER_FORMAT)
        if code == 0:
            return out.strip()
        if not ensure and any(text in err for text in GONE_ERRORS):
            return ""
        raise BackendError(f"cannot reach the tmux server on socket {self.socket}: {err.strip() or code}")

    async def changed_since(self, then: str) -> str:
        """Whether the tmux server a session was made in (``then``) is still the one on the socket, in words."""
        try:
            now = await self.instance()
        except BackendError as error:
            return f" (and {error})"
        if not then or now == then:
            return f" (tmux server {now}, where it was made)" if now else ""
        return f" (the tmux server it was made in, {then}, is now {now or 'gone'})"

    async def snapshot(self, handle: TmuxHandle) -> Snapshot:
        """The pane's screen, its modes, and in the alternate screen the primary one under it. Two reads when
        it is in the alternate screen (tmux refuses ``capture-pane -a`` otherwise): the second says again
        whether it still is, and the first is taken again if it changed in between."""
        target = ("-t", handle.pane)
        for _ in range(3):
            code, out, err = await self.run("display-message", "-p", *target, PANE_FORMAT, ";", *CAPTURE, *target)
            first, _, screen = out.partition("\n")
            try:
                pane = parse_pane(first)
            except ValueError:
                pane = {}
            if code != 0 or (pane.get("pane_id"), pane.get("@tether_marker")) != (handle.pane, handle.marker):
                raise BackendError(f"no screen for {handle.session}: {err.strip() or 'not this session'}")
            primary = None
            if pane["alternate_on"] == "1":
                asked = (*CAPTURE, "-a", *target, ";", "display-message", "-p", *target, "#{alternate_on}")
                code, out, _ = await self.run(*asked)
                kept, _, still = out.rstrip("\n").rpartition("\n")
                if code != 0 or still != "1":
                    continue  # it left the alternate screen in between: read it again
                primary = kept.encode()
            return Snapshot.of(pane, screen.rstrip("\n").encode(), primary)
        raise BackendError(f"no screen for {handle.session}: it went in and out of the alternate screen")
