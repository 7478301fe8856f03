"""The local backend: a PTY child in its own session on this host.

Where the session holder is built (TETHER_HOLDER), the PTY and the program belong to a holder
(``local_held``), so the shell outlives its worker and a later worker on this host adopts it. Otherwise,
or when asked (``holder=None``), the worker holds the PTY itself, and the shell ends with the worker.

The child is started through ``setsid -c`` so that it leads a new session with
the PTY as its controlling terminal: Ctrl-C then reaches the foreground job,
and the whole session can be found and signalled later. A pidfd tells us
when it exits without a thread per child.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import functools
import os
import pwd
import shutil
import struct
import subprocess
import termios

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
    Tags,
    child_env,
)
from terminals.backends.ending import terminate_tree
from terminals.backends.handles import LocalHandle
from terminals.backends.holder import holder_binary, mux_program
from terminals.backends.local_held import attach_held, inspect_held, remove_held, spawn_held
from terminals.backends.procfs import ProcessIdentity, boot_id, find_tree, find_tree_by_session_label

_BUILT = object()


def _set_size(fd: int, cols: int, rows: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


@functools.cache
def _default_signals() -> tuple[str, ...]:
    """``env --default-signal`` where env has it (GNU coreutils 8.31 on), else nothing."""
    try:
        done = subprocess.run(["env", "--default-signal", "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return ()
    return ("env", "--default-signal") if done.returncode == 0 else ()


async def _until_ready(fd: int, *, write: bool = False) -> None:
    loop = asyncio.get_running_loop()
    ready = loop.create_future()
    add, remove = (loop.add_writer, loop.remove_writer) if write else (loop.add_reader, loop.remove_reader)
    add(fd, lambda: ready.done() or ready.set_result(None))
    try:
        await ready
    finally:
        remove(fd)


class LocalProcess(Process):
    def __init__(self, popen: subprocess.Popen, master: int, identity: ProcessIdentity, marker: str):
        self._popen = popen  # kept referenced so subprocess's own cleanup never reaps our child
        self._master: int | None = master
        self.identity = identity
        self.marker = marker
        self._pidfd = os.pidfd_open(identity.pid)
        self._exit: Exit | None = None
        self._reaping: asyncio.Task | None = None
        self.handle = LocalHandle(process=identity, marker=marker)

    async def read(self) -> bytes:
        while self._master is not None:
            try:
                data = self._read_available()
            except BlockingIOError:
                await _until_ready(self._master)
            except OSError as error:
                if error.errno == errno.EIO:  # every holder of the terminal has closed it
                    return b""
                raise
            else:
                # Yield even when data was ready at once: a fast producer must not starve the loop.
                await asyncio.sleep(0)
                return data
        return b""

    def _read_available(self) -> bytes:
        """One read, then more while more is ready: a PTY hands out about 4 KiB per read, and fewer,
        larger chunks make every hop after this one cheaper. Raises BlockingIOError when nothing is ready."""
        data = os.read(self._master, READ_CHUNK)
        parts, size = [data], len(data)
        while size < READ_CHUNK:
            try:
                more = os.read(self._master, READ_CHUNK - size)
            except (BlockingIOError, OSError):
                break
            if not more:
                break
            parts.append(more)
            size += len(more)
        return b"".join(parts) if len(parts) > 1 else data

    async def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            if self._master is None:
                raise BackendError("the terminal is closed")
            try:
                view = view[os.write(self._master, view) :]
            except BlockingIOError:
                await _until_ready(self._master, write=True)

    async def resize(self, cols: int, rows: int) -> None:
        if self._master is None:
            raise BackendError("the terminal is closed")
        _set_size(self._master, cols, rows)

    async def wait(self) -> Exit:
        if self._reaping is None:
            self._reaping = asyncio.ensure_future(self._reap())
        return await asyncio.shield(self._reaping)

    async def _reap(self) -> Exit:
        while True:
            pid, status = os.waitpid(self.identity.pid, os.WNOHANG)
            if pid:
                break
            await _until_ready(self._pidfd)
        self._popen.returncode = status  # tell subprocess we reaped it ourselves
        os.close(self._pidfd)
        if os.WIFSIGNALED(status):
            self._exit = Exit(signal=os.WTERMSIG(status), source="waitpid")
        else:
            self._exit = Exit(code=os.WEXITSTATUS(status), source="waitpid")
        return self._exit

    async def terminate(self, grace: float = 2.0) -> Exit | None:
        await terminate_tree(marker=self.marker, leader=self.identity, grace=grace)
        exit = await asyncio.wait_for(self.wait(), 10)
        self._close_master()
        return exit

    async def detach(self) -> None:
        # A local PTY cannot outlive its master: closing it hangs up the session.
        self._close_master()

    def _close_master(self) -> None:
        if self._master is not None:
            os.close(self._master)
            self._master = None


class LocalBackend(Backend):
    name = "local"
    can_find_by_label = True

    def __init__(self, holder=_BUILT):
        # The holder binary that holds new shells, or None: the worker holds them (they end with it).
        self.holder = holder_binary() if holder is _BUILT else holder

    async def pipes_program(self, instance: str = "") -> str:
        return mux_program()  # on this host

    async def attach(self, handle: LocalHandle) -> Process:
        if handle.holder is None:
            return await super().attach(handle)
        return await attach_held(handle)

    async def find_by_label(self, label: str) -> str | None:
        left = await asyncio.to_thread(find_tree_by_session_label, label)
        return f"pid {left[0].pid} carries TETHER_SESSION={label}" if left else None

    async def spawn(
        self, spec: SpawnSpec, tags: Tags, before_start: BeforeStart | None = None, instance: str = ""
    ) -> Process:
        # One step creates and starts the child: there is no moment in between to keep a handle from.
        account = pwd.getpwuid(os.getuid())
        env = child_env(spec, tags, {"HOME": account.pw_dir, "USER": account.pw_name, "SHELL": account.pw_shell})
        program = spec.argv[0]
        if shutil.which(program, path=env["PATH"]) is None:
            raise SpawnError(f"program not found: {program}")
        if spec.cwd and not os.path.isdir(spec.cwd):
            raise SpawnError(f"working directory does not exist: {spec.cwd}")
        if self.holder is not None:
            return await spawn_held(self.holder, spec, tags, env, spec.cwd or account.pw_dir)
        master, slave = os.openpty()
        try:
            _set_size(slave, spec.cols, spec.rows)
            # setsid -c: a new session whose controlling terminal is the PTY (stdin); env --default-signal: no
            # signal ignored (a worker started as a script's `&` job ignores SIGINT and SIGQUIT, and an ignored
            # signal outlives exec: Ctrl-C would reach nothing), as the session holder gives its program.
            popen = subprocess.Popen(
                [*_default_signals(), "setsid", "-c", *spec.argv],
                stdin=slave,
                stdout=slave,
                stderr=slave,
                cwd=spec.cwd or account.pw_dir,
                env=env,
                close_fds=True,
            )
        except OSError as error:
            os.close(master)
            raise SpawnError(f"could not start {program}: {error}") from None
        finally:
            os.close(slave)
        os.set_blocking(master, False)
        identity = ProcessIdentity.of(popen.pid)
        if identity is None:  # exited and was reaped already: impossible while we hold it, but be plain
            raise SpawnError(f"{program} vanished at start")
        return LocalProcess(popen, master, identity, tags.marker)

    async def inspect(self, handle: LocalHandle) -> Inspection:
        if handle.holder is not None:
            return await inspect_held(handle)
        identity = handle.process
        if identity.is_alive():
            return Inspection(Status.ALIVE, detail=f"pid {identity.pid} with matching start time")
        if left := await self.survivors(handle):
            # The program is gone but part of its tree runs on (a child that ignores SIGHUP): not over yet.
            return Inspection(Status.ALIVE, detail=f"pid {identity.pid} is gone, but {left} of its processes still run")
        # Only the owner could reap the exit status; another process cannot read it back.
        return Inspection(Status.GONE, detail=f"pid {identity.pid} is gone and nothing carries its marker")

    async def inspect_launch(self, intent: LocalHandle) -> Inspection:
        if left := await self.survivors(intent):
            return Inspection(
                Status.ALIVE,
                detail=f"{left} process(es) carry its marker, though no handle was saved",
                handle=LocalHandle(marker=intent.marker),
            )
        # Started and ended, or never started: a child this owner forked leaves nothing to tell which.
        return Inspection(Status.GONE, detail="no process carries its marker; it may have run and ended")

    async def instance(self, *, ensure: bool = False) -> str:
        return f"boot {boot_id()}"  # a reboot ends every process the host had

    async def vacancy(self, instance: str) -> str | None:
        if instance and instance != await self.instance():
            return f"the host has rebooted since it ran ({instance}): every process it had ended"
        return None

    async def survivors(self, handle: LocalHandle) -> int:
        return len(await asyncio.to_thread(find_tree, marker=handle.marker))

    async def remove(self, handle: LocalHandle, grace: float = 2.0) -> None:
        if handle.holder is not None:
            await remove_held(handle, grace)
            return
        await terminate_tree(marker=handle.marker, leader=handle.process, grace=grace)
