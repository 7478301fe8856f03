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
import os
import pwd
import re
import shutil
import sys
from dataclasses import asdict, replace
from pathlib import Path

from terminals.backends import ending, procfs
from terminals.backends.base import (
    Backend,
    BackendError,
    BeforeStart,
    Inspection,
    SpawnError,
    SpawnSpec,
    Status,
    TaggedSession,
    Tags,
    child_env,
)
from terminals.backends.handles import TmuxHandle
from terminals.backends.holder import mux_program
from terminals.backends.tmux_process import TmuxProcess
from terminals.backends.tmux_screen import Snapshot
from terminals.backends.tmux_server import SERVER_FORMAT, TmuxServer, chain, cmdline
from terminals.backends.tmux_shim import SHIM_MARKER_VARIABLE

SHIM = Path(__file__).with_name("tmux_shim.py")
FORCED_BY_TMUX = ("TERM", "TERM_PROGRAM", "TERM_PROGRAM_VERSION", "TMUX", "TMUX_PANE", "SHELL")
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


def session_name(tags: Tags) -> str:
    # tmux session names cannot hold ':' or '.'; the marker keeps a respawned session apart.
    return f"{re.sub(r'[^A-Za-z0-9_-]', '_', tags.session)[:48]}-{tags.marker[:8]}"


class TmuxBackend(Backend):
    name = "tmux"
    can_adopt = True
    can_retag = True
    can_snapshot = True
    can_find_by_label = True

    def __init__(self, socket: str = "tether"):
        self.socket = socket
        self.server = TmuxServer(socket)

    async def pipes_program(self, instance: str = "") -> str:
        return mux_program()  # on this host

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
        shim = [sys.executable, "-I", "-S", str(SHIM), self.server.tmux, *fixes, "--", *spec.argv]
        options = {**SESSION_OPTIONS, **{f"@tether_{key}": str(value) for key, value in asdict(tags).items()}}
        size = ["-x", str(spec.cols), "-y", str(spec.rows)]
        # The shim carries the marker under its own name and hands it to the program (see tmux_shim).
        env[SHIM_MARKER_VARIABLE] = env.pop(procfs.MARKER_VARIABLE)
        env_args = [x for key, value in env.items() for x in ("-e", f"{key}={value}")]
        create = ["new-session", "-d", "-s", name, *size, "-c", cwd.replace("#", "##")]
        commands = [
            ["start-server"],
            # A server that exits with its last session races the next spawn on the same socket ("server
            # exited unexpectedly"): keep it up; it costs one idle process.
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
            async with self.server.turn():  # a session made: notifications (see TmuxServer.turn)
                code, out, err = await self.server.run(*chain(commands))
            if "server exited" not in err:
                break
            # Another client's kill-server (or an exiting server of an older Tether) took our command
            # list with it: nothing of ours survived it, so asking the next server is safe.
            await asyncio.sleep(0.1)
        if not out.startswith("%"):  # no session was made (a failed command list stops at the failure)
            raise SpawnError(f"tmux could not start {program}: {err.strip() or out.strip()}")
        pane, _, server = out.strip().partition(" ")
        handle = replace(self.server.handle(name, pane, tags.marker), instance=server)
        try:
            if code != 0:
                raise BackendError(f"tmux could not set up {name}: {err.strip()}")
            return await self._adopt(handle)
        except BackendError as error:
            await self.server.end_tree(handle, 0.5)
            await self.server.kill_session(name)
            # A shim that was not one yet when its pane was looked at (tmux had forked, not exec'd it: a loaded
            # host) dies of the pane's hang-up; SpawnError says nothing ran, so that is waited for (proven gone).
            await ending.terminate_tree(marker=tags.marker, variable=SHIM_MARKER_VARIABLE, grace=0.5)
            raise SpawnError(str(error)) from None

    async def _adopt(self, handle: TmuxHandle) -> TmuxProcess:
        state = await self.server.state(handle)
        if state.status not in (Status.ALIVE, Status.EXITED):
            raise BackendError(f"cannot attach to {handle.session}: {state.detail}")
        process = TmuxProcess(self.server, handle, state)
        await process.open()
        return process

    async def attach(self, handle: TmuxHandle) -> TmuxProcess:
        return await self._adopt(handle)

    async def inspect(self, handle: TmuxHandle) -> Inspection:
        state = await self.server.state(handle)
        return Inspection(state.status, state.exit, state.detail)

    async def inspect_launch(self, intent: TmuxHandle) -> Inspection:
        """A session tagged with the intent's marker is the one its owner made: look at that. None, on the
        same server as then, nothing carrying the marker, and no tmux client of the dead owner's still making
        one: it never started."""
        for tagged in await self.list_tagged():
            if tagged.tags["marker"] == intent.marker:
                seen = await self.inspect(tagged.handle)
                return Inspection(seen.status, seen.exit, seen.detail, handle=tagged.handle)
        if left := await self.survivors(intent):
            # A session made without its tags (its creation cut short) may run the program unsupervised.
            return Inspection(Status.GONE, detail=f"no session holds it, but {left} process(es) carry its marker")
        now = await self.instance()
        server = int(now.rpartition(":")[2].partition("@")[0]) if now else 0  # a server keeps its client's argv
        clients = [c for c in await asyncio.to_thread(procfs.find_by_cmdline, intent.marker) if c.pid != server]
        if clients:
            return Inspection(Status.UNKNOWN, detail=f"tmux client pid {clients[0].pid} may still be creating it")
        if now and now == intent.instance:
            return Inspection(
                Status.NEVER_STARTED, detail=f"no session carries its marker on tmux server {now}, where it was to run"
            )
        then = intent.instance or "not recorded"
        return Inspection(
            Status.GONE, detail=f"no session carries its marker, but the tmux server is {now or 'gone'} (was {then})"
        )

    def socket_path(self) -> str:
        return self.server.socket_path()

    async def instance(self, *, ensure: bool = False) -> str:
        return await self.server.instance(ensure=ensure)

    async def snapshot(self, handle: TmuxHandle) -> Snapshot:
        return await self.server.snapshot(handle)

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
            if pid and b"tmux" in cmdline(pid):
                return None  # the old server still runs (its socket was removed): no proof from here
            return f"the tmux server it ran in ({server}) is gone, and every session it held"
        if not now:
            return f"no tmux server runs on socket {self.socket}: every session it held is gone"
        return None

    async def survivors(self, handle: TmuxHandle) -> int:
        """Processes of its program's tree, and its shim (alive while its pane is): by their markers."""
        marker = handle.marker
        program = await asyncio.to_thread(procfs.find_tree, marker=marker)
        shim = await asyncio.to_thread(procfs.find_tree, marker=marker, variable=SHIM_MARKER_VARIABLE)
        return len(program) + len(shim)

    async def list_tagged(self) -> list[TaggedSession]:
        fmt = "|".join(["#{session_name}", "#{pane_id}", *(f"#{{@tether_{key}}}" for key in TAGS)])
        code, out, _ = await self.server.run("list-sessions", "-F", fmt)
        found = []
        for line in out.splitlines() if code == 0 else []:
            name, pane, *values = line.split("|")
            tags = dict(zip(TAGS[1:], values[-4:], strict=True))
            tags["session"] = "|".join(values[:-4])  # the free-text field, in case it holds the separator
            if tags["session"] and tags["marker"]:
                found.append(TaggedSession(handle=self.server.handle(name, pane, tags["marker"]), tags=tags))
        return found

    async def find_by_label(self, label: str) -> str | None:
        tagged = [t for t in await self.list_tagged() if t.tags["session"] == label]
        return f"tmux session {tagged[0].handle.session} is tagged with it" if tagged else None

    async def tag(self, handle: TmuxHandle, **values: str | int) -> None:
        """Update owner tags (owner_pid, owner_started_at, heartbeat), e.g. by the worker that adopted it."""
        if not (await self.server.state(handle)).ours:
            raise BackendError(f"no session {handle.session} to tag")
        commands = [
            ["set-option", "-t", f"={handle.session}:", f"@tether_{key}", str(value)] for key, value in values.items()
        ]
        code, _, err = await self.server.run(*chain(commands))
        if code != 0:
            raise BackendError(f"could not tag {handle.session}: {err.strip()}")

    async def remove(self, handle: TmuxHandle, grace: float = 2.0) -> None:
        if not handle.pane:  # an intent whose session was never found: only processes by their markers
            await ending.terminate_tree(marker=handle.marker, grace=grace)
            await ending.terminate_tree(marker=handle.marker, variable=SHIM_MARKER_VARIABLE, grace=0)
            return
        state = await self.server.state(handle)
        await self.server.end_tree(handle, grace, state)
        if state.ours:  # never a session whose pane, name and marker do not all match
            await self.server.kill_session(handle.session)
