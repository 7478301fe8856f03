"""The worker's end of a session holder's socket (terminals/backends/holder_wire.py), on the worker's own event loop
(uvloop, TETHER_WORKER_LOOP's default)."""

from __future__ import annotations

import asyncio
import socket

import uvloop

from terminals.backends.base import BackendError
from terminals.backends.holder_wire import SocketLink


def against_a_holder_that_closed(tmp_path, sent: bytes, owner, loop_factory=uvloop.new_event_loop):
    """``owner(link)``, on ``loop_factory``'s loop, with a link to a holder that sent ``sent`` and closed its end."""
    path = str(tmp_path / "holder.sock")
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    server.listen()

    async def main():
        link = await SocketLink.open(path)
        peer, _ = server.accept()
        peer.sendall(sent)
        peer.close()
        try:
            return await owner(link)
        finally:
            await link.close()

    try:
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            return runner.run(main())
    finally:
        server.close()
        (tmp_path / "holder.sock").unlink()


async def writes(link: SocketLink, times: int = 3, pause: float = 0.0) -> list[str]:
    """What each of ``times`` acks written to the holder came to."""
    said = []
    for _ in range(times):
        try:
            await link.write(b"ack")
            said.append("written")
        except BackendError:
            said.append("gone")
        await asyncio.sleep(pause)
    return said


def test_a_write_to_a_holder_that_has_gone_is_a_backend_error_on_uvloop(tmp_path):
    """A holder that ended (after a Kill) closes its socket; the owner's next ack to it must say the holder is gone,
    as every caller expects (BackendError), not uvloop's RuntimeError on a closed handle: that one escaped the pump,
    and a killed shell's outcome was never recorded (it stayed running)."""

    async def owner(link: SocketLink) -> list[str]:
        assert await link.read() == b""  # the holder's end: gone
        return await writes(link, pause=0.05)  # the first may still be taken by the kernel; later ones find it closed

    said = against_a_holder_that_closed(tmp_path, b"", owner)
    assert said[-1] == "gone", said


def test_what_the_holder_sent_before_it_closed_is_read_after_a_write_it_no_longer_takes(tmp_path):
    """A killed shell's holder sends its last output and the exit, then closes its end. An owner that writes to it
    meanwhile (an ack, a screen to keep) is told the holder is gone, and still reads everything it sent: a stream
    transport's failed write ended its reading too, dropping the unread exit, and the outcome was recorded unknown
    (ten streaming shells killed at once: one was, in one full run)."""

    async def owner(link: SocketLink) -> tuple[list[str], bytes]:
        await asyncio.sleep(0.1)  # the holder has closed its end
        said, got = await writes(link), b""
        while data := await link.read():
            got += data
        return said, got

    for loop_factory in (uvloop.new_event_loop, asyncio.new_event_loop):
        said, got = against_a_holder_that_closed(tmp_path, b"the last output, then the exit", owner, loop_factory)
        assert "gone" in said, said
        assert got == b"the last output, then the exit"
