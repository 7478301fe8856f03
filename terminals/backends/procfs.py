"""Process identity and process-tree discovery from /proc.

A pid alone is not an identity: pids are reused. Every process we may signal is
recorded as (pid, start time in clock ticks since boot, boot id), and is only
signalled while all three still match.

Descendants that detach (``setsid``, double fork) leave the process group and
the session, so trees are also found by a marker variable that every process
we spawn inherits in its environment.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import os
import signal
import time
import weakref
from dataclasses import asdict, dataclass
from pathlib import Path

PROC = Path("/proc")
MARKER_VARIABLE = "TETHER_PROCESS_MARKER"


@functools.cache
def boot_id() -> str:
    """This boot's id: read once, as it cannot change while this process runs (every identity check asks)."""
    return (PROC / "sys/kernel/random/boot_id").read_text().strip()


def _stat_fields(pid: int) -> list[str] | None:
    try:
        # A plain open on a str path: pathlib's objects cost more than the read on a host of 15,000 processes.
        with open(f"/proc/{pid}/stat") as file:
            raw = file.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name is in parentheses and may itself contain spaces or ')'.
    return raw[raw.rindex(")") + 2 :].split()


@dataclass(frozen=True)
class ProcessIdentity:
    pid: int
    start_time: int
    boot_id: str

    @classmethod
    def of(cls, pid: int) -> ProcessIdentity | None:
        fields = _stat_fields(pid)
        if fields is None:
            return None
        # Field 22 of stat is starttime; fields[0] here is field 3 (state).
        return cls(pid=pid, start_time=int(fields[19]), boot_id=boot_id())

    @classmethod
    def from_json(cls, data: dict) -> ProcessIdentity:
        return cls(pid=int(data["pid"]), start_time=int(data["start_time"]), boot_id=str(data["boot_id"]))

    def to_json(self) -> dict:
        return asdict(self)

    def is_alive(self) -> bool:
        """True while this exact process exists and has not exited (a zombie has exited)."""
        if self.boot_id != boot_id():
            return False
        fields = _stat_fields(self.pid)
        return fields is not None and int(fields[19]) == self.start_time and fields[0] not in {"Z", "X"}

    def is_present(self) -> bool:
        """True while the pid still names this process, exited or not: a zombie keeps its pid (and with
        it the number of the session it leads) until it is reaped."""
        if self.boot_id != boot_id():
            return False
        fields = _stat_fields(self.pid)
        return fields is not None and int(fields[19]) == self.start_time

    def is_stopped(self) -> bool:
        """True while this exact process is stopped by a signal (SIGSTOP, SIGTSTP) or a tracer."""
        fields = _stat_fields(self.pid)
        return self.is_alive() and fields is not None and fields[0] in {"T", "t"}

    def signal(self, signum: int) -> bool:
        """Send ``signum`` only if the pid still names this process. Returns whether it was sent.

        The process is pinned with a pidfd before its identity is checked: a pidfd names one process, not
        a number, so the pid cannot be reused by another between the check and the signal.
        """
        try:
            pidfd = os.pidfd_open(self.pid)
        except OSError as error:
            if error.errno in (errno.ESRCH, errno.EINVAL):  # gone, or a thread id: not a process we recorded
                return False
            raise
        try:
            if not self.is_alive():
                return False
            signal.pidfd_send_signal(pidfd, signum)
        except ProcessLookupError:
            return False
        except PermissionError:
            # Another user's process (a sudo in the shell): not ours to signal. Said as not sent, never
            # raised, so that a round that stopped the rest of a tree still lets every one of them go on.
            return False
        finally:
            os.close(pidfd)
        return True


def zombie_end(pid: int, parent: int) -> tuple[str, str] | None:
    """How an exited, not yet reaped child of ``parent`` ended, as ``(code, signal)`` with one of them "" (as
    tmux's pane_dead_status and pane_dead_signal say it), from its wait status (stat field 52). While it is
    unreaped its pid cannot name another process, so the status is that child's own."""
    fields = _stat_fields(pid)
    if fields is None or fields[0] != "Z" or int(fields[1]) != parent or len(fields) < 50:
        return None
    status = int(fields[49])
    return ("", str(os.WTERMSIG(status))) if os.WIFSIGNALED(status) else (str(os.WEXITSTATUS(status)), "")


def session_of(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[3]) if fields else None


def _tether_variables(pid: int) -> dict[str, str]:
    """The TETHER_* variables of a process's environment (none when it is gone or another user's)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as file:
            environ = file.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return {}
    found = {}
    if b"TETHER_" in environ:
        for item in environ.split(b"\0"):
            if item.startswith(b"TETHER_"):
                key, _, value = item.decode(errors="replace").partition("=")
                found[key] = value
    return found


def _has_marker(pid: int, marker: str, variable: str = MARKER_VARIABLE) -> bool:
    return _tether_variables(pid).get(variable) == marker


@dataclass(frozen=True)
class ProcessTable:
    """One pass over /proc: each process's session and the Tether variables of its environment. Finding a
    tree in it costs nothing more, so every tree being ended at once is found in one shared pass
    (``shared_table``), not one pass each: ending 5,000 idle shells on a host of 15,000 processes took a pass
    per scan per tree, about 0.3 trees a second."""

    sessions: dict[int, int]  # pid -> session id
    variables: dict[int, dict[str, str]]  # pid -> its TETHER_* variables (only those that have any)

    @classmethod
    def read(cls, with_sessions: bool = True) -> ProcessTable:
        sessions, variables, me = {}, {}, str(os.getpid())
        for name in os.listdir("/proc"):  # plain os calls: pathlib's objects cost more than the reads here
            if not name.isdigit() or name == me:
                continue
            pid = int(name)
            if found := _tether_variables(pid):  # none if unreadable (sudo in a shell): still a member below
                variables[pid] = found
            if with_sessions and (session := session_of(pid)) is not None:
                sessions[pid] = session
        return cls(sessions, variables)

    def tree(
        self, *, marker: str, leader: ProcessIdentity | None = None, variable: str = MARKER_VARIABLE
    ) -> list[ProcessIdentity]:
        """See ``find_tree``."""
        marked = [pid for pid, found in self.variables.items() if found.get(variable) == marker]
        members = []
        if leader is not None:
            members = [pid for pid, session in self.sessions.items() if session == leader.pid and pid not in marked]
        # Checked after the pass: a leader present now held its pid all through it, so every process seen in
        # a session of that number was in its session.
        if members and not leader.is_present():
            members = []
        found = []
        for pid in marked + members:
            identity = ProcessIdentity.of(pid)
            if identity is not None and identity.is_alive():
                found.append(identity)
        return found


def find_tree(
    *, marker: str, leader: ProcessIdentity | None = None, variable: str = MARKER_VARIABLE
) -> list[ProcessIdentity]:
    """Every live process whose environment says ``variable=marker``, or in the session ``leader`` leads.

    A session is known only by its number, the leader's pid, and that number is ours only while our
    leader holds it. Once the leader is gone (its pid free for reuse, perhaps by a stranger that called
    setsid) or the pid names another process, only members carrying the marker are taken.
    """
    return ProcessTable.read(with_sessions=leader is not None).tree(marker=marker, leader=leader, variable=variable)


class _SharedPass:
    """The passes over /proc of one event loop (of one kind: with sessions or without): a caller gets a
    table read wholly after the moment it names, from a pass already under way if that one began since,
    else from the next."""

    def __init__(self, with_sessions: bool) -> None:
        self.with_sessions = with_sessions
        self.running: asyncio.Future | None = None
        self.running_since = 0.0
        self.last: tuple[float, ProcessTable] | None = None

    async def table(self, fresh_from: float) -> ProcessTable:
        while True:
            if self.last is not None and self.last[0] >= fresh_from:
                return self.last[1]
            if self.running is None:
                self.running_since = time.monotonic()
                self.running = asyncio.ensure_future(self._read(self.running_since))
            if self.running_since >= fresh_from:
                return await asyncio.shield(self.running)
            try:
                await asyncio.shield(self.running)  # begun before the caller's moment: the next one is its
            except Exception:
                pass  # that pass's failure is its callers'; this caller asks for the next

    async def _read(self, since: float) -> ProcessTable:
        try:
            # On a thread, so a host with thousands of processes does not stall the event loop (and with it
            # every other session) while it runs.
            table = await asyncio.to_thread(ProcessTable.read, self.with_sessions)
            self.last = (since, table)
            return table
        finally:
            self.running = None


_passes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[bool, _SharedPass]] = weakref.WeakKeyDictionary()


async def shared_table(fresh_from: float, with_sessions: bool = True) -> ProcessTable:
    """A table of every process, read wholly after ``fresh_from`` (``time.monotonic()``), shared by every
    caller of this event loop that asks meanwhile. Without sessions a pass reads half the files."""
    loop = asyncio.get_running_loop()
    if (passes := _passes.get(loop)) is None:
        passes = _passes[loop] = {}
    if (shared := passes.get(with_sessions)) is None:
        shared = passes[with_sessions] = _SharedPass(with_sessions)
    return await shared.table(fresh_from)


def find_tree_by_session_label(label: str) -> list[ProcessIdentity]:
    """Every live process whose environment says TETHER_SESSION=label (set for every shell we start)."""
    needle = f"TETHER_SESSION={label}".encode()
    found = []
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            identity = ProcessIdentity.of(int(entry.name))
            if identity is not None and identity.is_alive():
                found.append(identity)
    return found


def find_by_cmdline(text: str) -> list[ProcessIdentity]:
    """Every live process with ``text`` in one of its arguments (a tmux client still carrying out a command)."""
    needle = text.encode()
    found = []
    for entry in PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if needle in argv:
            identity = ProcessIdentity.of(int(entry.name))
            if identity is not None and identity.is_alive():
                found.append(identity)
    return found
