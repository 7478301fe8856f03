"""A program in a tmux pane, as its owner holds it: output through a control-mode client (``tmux -C``),
input as ``send-keys -H``, and the terminal stopped while nobody reads (see terminals.backends.tmux)."""

from __future__ import annotations

import asyncio
import logging
import os
import termios
from collections.abc import Callable

from terminals.backends import procfs
from terminals.backends.base import READ_CHUNK, BackendError, Exit, Process, Status
from terminals.backends.handles import TmuxHandle
from terminals.backends.tmux_control import ControlClient, Event, Sentinel
from terminals.backends.tmux_screen import ModeWatch, Snapshot
from terminals.backends.tmux_server import PaneState, TmuxServer, tty_of
from terminals.backends.tmux_shim import SENTINEL

log = logging.getLogger(__name__)

STALL_AFTER = 0.1  # seconds without a read after which the pane's terminal is stopped
PAUSE_AFTER = 300  # seconds; without it tmux drops a control client that is 5 minutes behind
SEND_KEYS_BATCH = 1024
GATHER_FROM = 2048  # a read with this much output (not a keystroke's echo) waits GATHER_SECONDS for more
GATHER_SECONDS = 0.001
GATHER_TIMES = 4  # up to this many times, while each wait brings more (and up to READ_CHUNK)
KEEP_MODES_AFTER = 0.2  # seconds: the modes tmux does not tell are kept with the session this long after a change


class TmuxProcess(Process):
    can_snapshot = True
    survives_owner = True  # the tmux server keeps the session; a later worker adopts it

    def __init__(self, server: TmuxServer, handle: TmuxHandle, state: PaneState):
        self.handle = handle
        self._server = server
        self._pane = handle.pane
        self._tty = state.tty
        self._shim = procfs.ProcessIdentity.of(state.pid) if state.pid else None
        self._client: ControlClient | None = None
        self._replies: list[Callable[[Event], None] | None] = []
        self._ready = bytearray()
        self._sentinel = Sentinel(SENTINEL % handle.marker.encode())
        self._ended = False
        self._dead_checks = 0
        self._stall: asyncio.TimerHandle | None = None
        self._stopped = False
        self._exit: Exit | None = None
        self._watching: asyncio.Future | None = None
        self._modes = ModeWatch()  # bracketed paste and focus events, which tmux does not tell
        self._keeping_modes: asyncio.TimerHandle | None = None

    async def open(self) -> None:
        """Attach the control client, and open the shim's gates as far as this owner may: start the program
        if the old owner died before it did (a spare unlock is harmless), release the shim once what reached
        us was read if the program has ended (its sentinel may have gone to nobody)."""
        await self._attach_client()
        self._flow(termios.TCOON)  # a dead owner may have left the terminal stopped
        self._unlock("go")
        if (await self._server.state(self.handle)).program_ended:
            self._send("display -p synced", lambda reply: self._unlock("release"))
        await self._drain()

    async def _attach_client(self) -> None:
        argv = [*self._server.argv(), "-u", "-C", "attach-session", "-t", f"={self.handle.session}"]
        # Alone on the socket until tmux has taken the client in: a notification meanwhile crashes tmux 3.3a.
        async with self._server.turn(alone=True):
            try:
                self._client = await ControlClient.start(argv, self._server.env)
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
            async with self._server.turn():
                await self._client.close()
            said = " ".join(event.lines if event else ["no answer in 10 s"]) + await self._server.changed_since(
                self.handle.instance
            )
            raise BackendError(f"cannot attach to {self.handle.session}: {said}")
        self._send(f"refresh-client -f pause-after={PAUSE_AFTER}")
        self._send("refresh-client -B 'tether-dead::#{pane_dead}'")  # pane subscriptions skip dead panes

    def _send(self, command: str, reply: Callable[[Event], None] | None = None, *, quiet: bool = False) -> None:
        if self._client is None or not self._client.open:
            if quiet:  # bookkeeping of a stream that is being closed
                return
            raise BackendError(f"the tmux control client of {self.handle.session} is closed")
        self._client.send(command)
        self._replies.append(reply)

    async def read(self) -> bytes:
        self._resume()
        if self._client is None:
            return b""
        try:
            waited, gathered = False, 0
            reader = self._client.reader
            # Parse what is already here up to a full chunk, but touch the pipe only when there is nothing.
            while not self._ended and len(self._ready) < READ_CHUNK:
                if not reader.buffered():
                    if self._ready:
                        if gathered >= GATHER_TIMES or len(self._ready) < GATHER_FROM:
                            break
                        # Heavy output: tmux passes it on about 4 KiB at a time, and every piece costs each
                        # stage after this one the same. A moment's wait lets more pieces come along.
                        gathered += 1
                        await asyncio.sleep(GATHER_SECONDS)
                        if not reader.pull():
                            break
                        continue
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
            data = self._sentinel.feed(event.data)
            self._ready += data
            if self._modes.feed(data) and self._keeping_modes is None:
                self._keeping_modes = asyncio.get_running_loop().call_later(KEEP_MODES_AFTER, self._keep_modes)
            if self._sentinel.seen and self._dead_checks == 0:
                # All the program's output is here: let the shim end, then confirm the pane is dead.
                self._unlock("release")
                self._check_dead()
        elif event.kind == "reply" and event.ours:
            reply = self._replies.pop(0) if self._replies else None
            if reply is not None:
                reply(event)
            elif event.error:
                log.warning("tmux %s: %s", self.handle.session, " ".join(event.lines))
        elif event.kind == "subscription" and event.pane == "tether-dead" and event.lines[0].startswith("1"):
            self._check_dead()
        elif event.kind == "pause" and event.pane == self._pane:
            log.warning("tmux paused %s after %ss behind; output was lost", self.handle.session, PAUSE_AFTER)
            self._send(f"refresh-client -A '{self._pane}:continue'", quiet=True)

    def _keep_modes(self) -> None:
        """What ModeWatch saw, kept with the session for an owner that adopts it, at most once in KEEP_MODES_AFTER
        (bash sets bracketed paste at every prompt and unsets it for each command)."""
        self._keeping_modes = None
        for command in self._modes.commands(self.handle.session):
            self._send(command, lambda _: None, quiet=True)

    def _unlock(self, gate: str) -> None:
        """Open one of the shim's gates; opening it twice is harmless (tmux says it is not locked)."""
        self._send(f"wait-for -U tether-{gate}-{self.handle.marker}", lambda reply: None, quiet=True)

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
        self._stall = None
        self._stopped = set_flow(self._tty, self._shim, action, self._stopped, self.handle.session)

    async def write(self, data: bytes) -> None:
        for start in range(0, len(data), SEND_KEYS_BATCH):
            self._send(f"send-keys -H -t {self._pane} {data[start : start + SEND_KEYS_BATCH].hex(' ')}")
        await self._drain()

    async def resize(self, cols: int, rows: int) -> None:
        """Returns once tmux has resized the window, so a snapshot taken next is of the new grid.

        A command of its own, in a shared turn (a window's layout changing is a notification), not a line
        to the control client: there its reply comes in line with the output, which the pump does not read
        while flow control holds this shell back, and the turn (and any control client attaching on this
        socket) would wait that long."""
        async with self._server.turn():
            code, _, err = await self._server.run(
                "resize-window", "-t", self._pane, "-x", str(int(cols)), "-y", str(int(rows)), timeout=5
            )
        if code != 0:
            log.info("tmux pane %s was not resized to %sx%s: %s", self._pane, cols, rows, err.strip())

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
            state = await self._server.state(self.handle)
            if self._exit is not None:  # terminate() read it meanwhile, before it removed the session
                break
            if state.exit is None and state.status != Status.ALIVE:
                raise BackendError(f"no exit can be known for {self.handle.session}: {state.detail}")
            self._exit = state.exit
            if self._exit is None:
                # The shim wakes this channel; the timeout covers a session killed from outside.
                await self._server.run("wait-for", f"tether-exit-{self.handle.marker}", timeout=10)
        return self._exit

    async def terminate(self, grace: float = 2.0) -> Exit | None:
        # Without a control client tmux reads the pane freely, so the shim can write its sentinel and end.
        await self.detach()
        await self._server.end_tree(self.handle, grace)
        exit = self._exit
        for _ in range(100):
            state = await self._server.state(self.handle)
            exit = state.exit or exit
            if exit is not None or state.status != Status.ALIVE:
                break
            await asyncio.sleep(0.02)
        # Kept before the session (tmux's record of the exit) goes: a wait() woken by the exit reads it here.
        self._exit = exit
        await self._server.kill_session(self.handle.session)
        return exit

    async def detach(self) -> None:
        if self._keeping_modes is not None:  # kept now, while the client is still there to say it
            self._keeping_modes.cancel()
            self._keep_modes()
        self._resume()
        self._ended = True
        client, self._client = self._client, None
        if client is not None:
            async with self._server.turn():  # a client gone: a notification
                await client.close()

    async def snapshot(self) -> Snapshot:
        return self._modes.over(await self._server.snapshot(self.handle))


def set_flow(tty: str, shim: procfs.ProcessIdentity | None, action: int, stopped: bool, session: str) -> bool:
    """Stop or start a pane's terminal output, only while its tty is still the shim's: whether it is stopped now."""
    if shim is None or not shim.is_alive() or not tty:
        return False
    try:
        fd = os.open(tty, os.O_RDWR | os.O_NOCTTY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return stopped
    try:
        if os.fstat(fd).st_rdev == tty_of(shim.pid):  # a pts number can be reused
            termios.tcflow(fd, action)
            return action == termios.TCOOFF
    except OSError as error:
        log.warning("tmux %s: tcflow failed: %s", session, error)
    finally:
        os.close(fd)
    return stopped
