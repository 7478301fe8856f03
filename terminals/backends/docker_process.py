"""A docker exec as its owner holds it: the hijacked TTY stream read and written on the event loop (a
thread per call for TLS and ssh engines), and the exit read back from the engine."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from typing import Any

import docker

from terminals.backends.base import READ_CHUNK, BackendError, Exit, Process
from terminals.backends.docker_exec import (
    DROPPED_CODE,
    ENGINE_ERRORS,
    LAST_OUTPUT_LIMIT,
    doubt,
    end_tree,
    exec_state,
    exit_of,
    settled,
)
from terminals.backends.handles import DockerHandle


def _loop_can_drive(raw: Any) -> bool:
    """Whether the loop's socket calls can drive the stream; TLS and ssh streams take a thread per call."""
    return isinstance(raw, socket.socket) and not isinstance(raw, ssl.SSLSocket)


class DockerProcess(Process):
    adoptable = False  # docker cannot attach a new client to a running exec

    def __init__(self, api: docker.APIClient, handle: DockerHandle, conn: Any):
        self.handle = handle
        self._api = api
        self._conn = conn
        raw = conn._sock if isinstance(conn, socket.SocketIO) else conn
        self._sock = raw
        self._on_loop = _loop_can_drive(raw)
        self._pending = bytearray()
        if self._on_loop:
            raw.setblocking(False)
            buffered = getattr(getattr(conn, "_response", None), "raw", None)
            reader = getattr(getattr(buffered, "_fp", None), "fp", None)
            if reader is not None:
                # http.client may have read output past the upgrade headers into its buffer.
                with contextlib.suppress(OSError, ValueError):
                    self._pending += reader.peek(READ_CHUNK) or b""
                    reader.read(len(self._pending))
        else:
            # The client's request timeout is still set on the socket: a thread's recv would end an idle
            # terminal's output after it (a timeout reads as EOF), and a long blocked write would fail.
            with contextlib.suppress(OSError, AttributeError):
                raw.settimeout(None)
        self._eof = asyncio.Event()
        self._reading = asyncio.Lock()
        self._users = 0  # reads and writes in progress on the socket
        self._closing = False
        self._broken = False  # the stream ended in an error, not at its end
        self._exit: Exit | None = None

    @property
    def exec_id(self) -> str:
        return self.handle.exec_id

    async def read(self) -> bytes:
        # One read at a time: a second sock_recv on the same socket would orphan the first one's wakeup.
        async with self._reading:
            if self._pending:
                chunk = bytes(self._pending[:READ_CHUNK])
                del self._pending[:READ_CHUNK]
                return chunk
            return await self._receive()

    async def _receive(self) -> bytes:
        """The next chunk from the socket; the caller holds ``_reading``."""
        if self._closing or self._eof.is_set():
            return b""
        self._users += 1
        try:
            if self._on_loop:
                chunk = await asyncio.get_running_loop().sock_recv(self._sock, READ_CHUNK)
            else:
                chunk = await asyncio.to_thread(self._sock.recv, READ_CHUNK)
        except OSError:
            # A broken stream has ended just the same, but docker may have dropped the exec (recording 126).
            self._broken = True
            chunk = b""
        finally:
            self._done_with_socket()
        if not chunk:
            self._eof.set()
        return chunk

    async def write(self, data: bytes) -> None:
        if self._closing:
            raise BackendError("the exec's stream is closed")
        self._users += 1
        try:
            if self._on_loop:
                await asyncio.get_running_loop().sock_sendall(self._sock, data)
            else:
                await asyncio.to_thread(self._sock.sendall, data)
        except OSError as error:
            raise BackendError(f"cannot write to the exec's stream: {error}") from None
        finally:
            self._done_with_socket()

    async def resize(self, cols: int, rows: int) -> None:
        try:
            await asyncio.to_thread(self._api.exec_resize, self.exec_id, height=rows, width=cols)
        except ENGINE_ERRORS as error:
            if (await exec_state(self._api, self.exec_id)).get("Running"):
                raise BackendError(f"docker could not resize the exec: {error}") from None

    async def wait(self) -> Exit:
        delay = 0.02
        while self._exit is None:
            info = await exec_state(self._api, self.exec_id)
            if info.get("Running") is False:
                if info.get("ExitCode") is None:
                    raise BackendError("docker says the exec is not running but records no exit code")
                if info["ExitCode"] == DROPPED_CODE and self._broken:
                    raise BackendError(
                        f"docker records {DROPPED_CODE} for exec {self.exec_id[:12]} after its stream broke: "
                        "it writes that itself when it drops an exec, so the program's own exit is unknown"
                    )
                if doubted := await doubt(self._api, self.handle, info["ExitCode"], settle=1.0):
                    raise BackendError(doubted)
                self._exit = exit_of(info["ExitCode"])
                break
            if not info:
                raise BackendError("docker no longer knows the exec (container removed or daemon restarted)")
            if self._eof.is_set():
                # The stream has ended; the exec's state follows a moment later.
                await asyncio.sleep(0.03)
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._eof.wait(), delay)
                delay = min(delay * 2, 1.0)
        return self._exit

    async def terminate(self, grace: float = 2.0) -> Exit | None:
        await end_tree(self._api, self.handle, grace)
        # Take in the last output before hanging up: if docker is still writing it when the stream goes,
        # docker overwrites the exit code it recorded with 126. It stays readable for the consumer.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(2):
                while len(self._pending) < LAST_OUTPUT_LIMIT:
                    async with self._reading:
                        if not (chunk := await self._receive()):
                            break
                        self._pending += chunk
        try:
            info = await settled(self._api, self.exec_id)
        finally:
            self._close()
        if info and info.get("ExitCode") is not None:
            self._exit = self._exit or exit_of(info["ExitCode"])
        return self._exit

    async def detach(self) -> None:
        """Drop the stream only. The exec keeps running unobserved (see the module doc); prefer ``abandon()``."""
        self._close()

    async def abandon(self, grace: float = 2.0) -> None:
        """Give the process up for good: a docker exec cannot be adopted, so nothing may be left behind."""
        await self.terminate(grace)

    def _close(self) -> None:
        if self._closing:
            return
        self._closing = True
        # shutdown() wakes a pending read (EOF) or write (EPIPE); closing the fd under them would strand them.
        with contextlib.suppress(OSError, AttributeError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._users += 1
        self._done_with_socket()

    def _done_with_socket(self) -> None:
        self._users -= 1
        if self._closing and not self._users:
            for closable in (self._conn, self._sock):
                with contextlib.suppress(OSError, AttributeError):
                    closable.close()
