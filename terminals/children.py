"""Programs a worker starts and waits for (tmux commands, a tmux control client, a session holder's starter),
the same on asyncio's loop and on uvloop.

Started by ``subprocess.Popen``, which closes every descriptor but the child's stdio: uvloop's own
subprocesses inherit its stdio sockets at other numbers too, and a daemon started that way (a tmux server,
forked by the first ``tmux new-session``) kept them, so the worker's wait for that command's output never
ended. The child's end is awaited through a pidfd, its pipes through the loop's readers: no thread per child,
and nothing that reaps another's children.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Sequence

PIPE = subprocess.PIPE
DEVNULL = subprocess.DEVNULL


class Child:
    def __init__(self, popen: subprocess.Popen):
        self.popen = popen
        self.pid = popen.pid
        self._pidfd: int | None = os.pidfd_open(popen.pid)
        self._ended: asyncio.Future | None = None

    @classmethod
    def start(cls, argv: Sequence[str], **options) -> Child:
        """``argv`` started now (``options`` as for ``subprocess.Popen``); OSError when it cannot be."""
        popen = subprocess.Popen(list(argv), **options)
        try:
            return cls(popen)
        except BaseException:
            popen.kill()
            popen.wait()
            raise

    @property
    def returncode(self) -> int | None:
        return self.popen.returncode

    def kill(self) -> None:
        self.popen.kill()  # nothing once it is reaped; a zombie not yet reaped ignores it

    async def end(self) -> int:
        """Kill it and wait until it has ended: a command given up on (its time ran out, or the wait for it
        was cancelled) is never left running. The wait goes on through a cancellation."""
        self.kill()
        return await asyncio.shield(self.wait())

    async def wait(self) -> int:
        """Its exit status, once it has ended."""
        if self._ended is None:
            loop = asyncio.get_running_loop()
            ended = loop.create_future()
            pidfd, popen = self._pidfd, self.popen

            def reap() -> None:  # the pidfd is readable: the child has ended, and waitpid returns at once
                loop.remove_reader(pidfd)
                os.close(pidfd)
                popen.wait()
                if not ended.done():
                    ended.set_result(None)

            loop.add_reader(pidfd, reap)
            self._pidfd, self._ended = None, ended  # reap() closes it
        await asyncio.shield(self._ended)
        return self.popen.returncode

    def __del__(self) -> None:
        if self._pidfd is not None:  # never waited for
            os.close(self._pidfd)

    async def communicate(self, input: bytes = b"") -> tuple[bytes, bytes]:
        """Write ``input`` to its stdin (then close it), read its stdout and stderr to their end, and wait for
        its exit; each stream only if it was started with a pipe for it."""
        loop = asyncio.get_running_loop()
        popen = self.popen
        streams = []
        if popen.stdin is not None:
            streams.append(_write_all(loop, popen.stdin, input))
        reads = [
            _read_all(loop, stream) if stream is not None else _nothing() for stream in (popen.stdout, popen.stderr)
        ]
        *_, out, err = await asyncio.gather(*streams, *reads)
        await self.wait()
        return out, err


async def _nothing() -> bytes:
    return b""


async def _read_all(loop: asyncio.AbstractEventLoop, stream) -> bytes:
    fd = stream.fileno()
    os.set_blocking(fd, False)
    got = bytearray()
    readable = asyncio.Event()
    loop.add_reader(fd, readable.set)
    try:
        while True:
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:
                readable.clear()
                await readable.wait()
                continue
            if not data:
                return bytes(got)
            got += data
    finally:
        loop.remove_reader(fd)
        stream.close()


async def _write_all(loop: asyncio.AbstractEventLoop, stream, data: bytes) -> None:
    fd = stream.fileno()
    os.set_blocking(fd, False)
    view = memoryview(data)
    writable = asyncio.Event()
    loop.add_writer(fd, writable.set)
    try:
        while view:
            try:
                view = view[os.write(fd, view) :]
            except BlockingIOError:
                writable.clear()
                await writable.wait()
            except BrokenPipeError:  # it ended without reading it all, as communicate() allows
                return
    finally:
        loop.remove_writer(fd)
        stream.close()


class PipeWriter:
    """Writes to a child's non-blocking pipe from the event loop (tmux's control client, the screen emulator): what
    the pipe cannot take now is kept, in order, and written as it drains. An error (the child is gone) is kept in
    ``broken``, what was waiting is dropped, and ``on_broken`` is told. The descriptor stays the caller's to close
    (``stop`` first)."""

    def __init__(self, fd: int, on_broken=None):
        self.fd: int | None = fd
        self.outgoing = bytearray()
        self.broken: OSError | None = None
        self.on_broken = on_broken
        self._waiting: list[asyncio.Future] = []

    def write(self, *parts: bytes) -> None:
        for part in parts:
            self.outgoing += part
        self._flush()

    def _flush(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self.outgoing and self.fd is not None:
                del self.outgoing[: os.write(self.fd, self.outgoing)]
        except BlockingIOError:
            loop.add_writer(self.fd, self._flush)
            return
        except OSError as error:
            self.broken = error
            self.outgoing.clear()
        if self.fd is not None:
            loop.remove_writer(self.fd)
        self._wake()
        if self.broken is not None and self.on_broken is not None:
            self.on_broken(self.broken)

    def _wake(self) -> None:
        for waiter in self._waiting:
            if not waiter.done():
                waiter.set_result(None)
        self._waiting.clear()

    async def drain(self) -> None:
        """Until everything written has been handed to the pipe (or the pipe is gone)."""
        if self.outgoing and self.fd is not None:
            waiter = asyncio.get_running_loop().create_future()
            self._waiting.append(waiter)
            await waiter

    def stop(self) -> None:
        """No more writing (the caller closes the descriptor): what waited is dropped, and waiters go on."""
        if self.fd is not None:
            asyncio.get_running_loop().remove_writer(self.fd)
            self.fd = None
        self.outgoing.clear()
        self._wake()
