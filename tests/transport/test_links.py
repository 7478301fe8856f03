"""Direct links between a web process and a worker (transport/links.py), over real sockets: what goes over a
link, who may open one, the order frames leave in, and what happens when a link drops or is spoken to wrongly.
Each test's two ends are one process's two ``Links`` (a daphne's and a worker's), as the layer makes them."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import struct
import uuid

import pytest

from transport import link as link_module
from transport import metrics
from transport.link import HEADER, MAC, MAGIC, NONCE, link_key
from transport.link_tls import LinkTls
from transport.links import Links

SECRET = "the-install-secret"
LOST = b"link lost"


class End:
    """One process's links and what arrived at it, in order."""

    def __init__(self, secret: str = SECRET, tls: LinkTls | None = None):
        self.arrived: list[tuple[str, bytes]] = []
        self.got = asyncio.Event()
        self.links = Links(
            self._deliver,
            lambda worker_id: link_key(secret, worker_id),
            lambda channel: self._deliver(channel, LOST),
            tls,
        )

    def _deliver(self, channel: str, data: bytes) -> None:
        self.arrived.append((channel, data))
        self.got.set()

    async def wait_for(self, count: int, timeout: float = 10.0) -> list[tuple[str, bytes]]:
        async with asyncio.timeout(timeout):
            while len(self.arrived) < count:
                self.got.clear()
                await self.got.wait()
        return self.arrived


@contextlib.asynccontextmanager
async def worker_and_web(
    spec: str = "unix",
    web_secret: str = SECRET,
    *,
    advertise: str = "",
    worker_tls: LinkTls | None = None,
    web_tls: LinkTls | None = None,
):
    worker_id = uuid.uuid4().hex
    worker, web = End(tls=worker_tls), End(web_secret, web_tls)
    address = await worker.links.listen(worker_id, spec, advertise)
    web.links.route("tether.worker.w", address, worker_id)
    try:
        yield worker, web, address, worker_id
    finally:
        await web.links.close()
        await worker.links.close()


def counted(counter) -> float:
    return counter._value.get()


@pytest.mark.parametrize("spec", ["unix", "tcp:127.0.0.1:0"])
async def test_a_viewers_message_goes_to_the_worker_over_its_link_and_the_answer_comes_back_on_it(spec):
    async with worker_and_web(spec) as (worker, web, address, _):
        assert address.startswith("unix:@tether-link-" if spec == "unix" else "tcp:127.0.0.1:")
        assert await web.links.send("tether.worker.w", "viewer-1", b"attach")
        assert await worker.wait_for(1) == [("tether.worker.w", b"attach")]
        # The worker answers the viewer's channel over the link that viewer's message came in on.
        assert await worker.links.send("viewer-1", "", b"attached")
        assert await web.wait_for(1) == [("viewer-1", b"attached")]
        assert len(web.links.dialed) == 1 and len(worker.links.accepted) == 1
        # A channel no link reaches is the caller's to publish: nothing is sent.
        assert not await worker.links.send("viewer-2", "", b"x")
        assert not await web.links.send("tether.worker.other", "viewer-1", b"x")
        # One link per worker, however many viewers.
        assert await web.links.send("tether.worker.w", "viewer-2", b"attach")
        await worker.wait_for(2)
        assert len(web.links.dialed) == 1 and len(worker.links.accepted) == 1


async def test_a_dialler_without_the_workers_key_is_refused_and_nothing_reaches_the_worker():
    refused, fallbacks = counted(metrics.LINK_REFUSED), counted(metrics.LINK_FALLBACKS)
    async with worker_and_web(web_secret="another-install") as (worker, web, _, _):
        assert not await web.links.send("tether.worker.w", "viewer-1", b"rm -rf /\r")
        await asyncio.sleep(0.2)
        assert worker.arrived == [] and worker.links.accepted == set()
        assert counted(metrics.LINK_REFUSED) == refused + 1
        assert counted(metrics.LINK_FALLBACKS) == fallbacks + 1
        # It does not dial again at once: Redis carries the stream until the retry.
        assert not await web.links.send("tether.worker.w", "viewer-1", b"x")
        assert counted(metrics.LINK_REFUSED) == refused + 1


async def test_a_process_that_cannot_prove_it_is_the_worker_gets_no_keystroke():
    """Another process listening where a worker was (its address reused): it answers the handshake but cannot
    prove the worker's key, so the web process sends it nothing."""
    heard: list[bytes] = []

    async def impostor(reader, writer):
        writer.write(MAGIC + os.urandom(NONCE))
        heard.append(await reader.readexactly(NONCE + MAC))
        writer.write(os.urandom(MAC))  # no proof
        with contextlib.suppress(ConnectionError):
            heard.append(await reader.read(65536))
        writer.close()

    server = await asyncio.start_server(impostor, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    web = End()
    web.links.route("tether.worker.w", f"tcp:127.0.0.1:{port}", "w1")
    try:
        assert not await web.links.send("tether.worker.w", "viewer-1", b"secret keys")
        await asyncio.sleep(0.2)
        assert len(heard) == 2 and heard[1] == b""  # the handshake's answer, then nothing at all
    finally:
        await web.links.close()
        server.close()


async def test_a_keystroke_goes_before_another_sessions_bulk_output():
    """Output of one session queued ahead (2.4 MB) does not hold back another session's echo."""
    async with worker_and_web() as (worker, web, _, _):
        assert await web.links.send("tether.worker.w", "bulk", b"attach")
        assert await web.links.send("tether.worker.w", "keys", b"attach")
        await worker.wait_for(2)
        for n in range(40):
            assert await worker.links.send("bulk", "", bytes([n]) * 60_000)
        assert await worker.links.send("keys", "", b"echo")
        arrived = await web.wait_for(41)
        order = [channel for channel, _ in arrived]
        # Some bulk was already in the socket when the key came; the key went before everything still queued.
        assert order.index("keys") < 10, order
        assert [data[0] for channel, data in arrived if channel == "bulk"] == list(range(40))


async def test_bulk_output_of_two_sessions_takes_turns():
    async with worker_and_web() as (worker, web, _, _):
        for viewer in ("first", "second"):
            assert await web.links.send("tether.worker.w", viewer, b"attach")
        await worker.wait_for(2)
        for viewer in ("first", "second"):
            for n in range(30):
                assert await worker.links.send(viewer, "", bytes([n]) * 60_000)
        arrived = await web.wait_for(60)
        order = [channel for channel, _ in arrived]
        assert order.index("second") < 10, order  # not after all thirty of the first
        for viewer in ("first", "second"):
            assert [data[0] for channel, data in arrived if channel == viewer] == list(range(30))


async def test_small_and_large_messages_of_one_channel_keep_their_order():
    async with worker_and_web() as (worker, web, _, _):
        assert await web.links.send("tether.worker.w", "viewer", b"attach")
        await worker.wait_for(1)
        sent = [bytes([n]) * (60_000 if n % 3 else 10) for n in range(60)]
        for data in sent:
            assert await worker.links.send("viewer", "", data)
        assert [data for _, data in await web.wait_for(60)] == sent


async def test_a_link_that_drops_is_dialled_again_and_the_stream_goes_on():
    reconnects = counted(metrics.LINK_RECONNECTS)
    async with worker_and_web() as (worker, web, _, _):
        assert await web.links.send("tether.worker.w", "viewer", b"one")
        await worker.wait_for(1)
        for link in list(worker.links.accepted):
            link.close("cut by the test")
        # The viewer that sent over it is told (it then says its ack again and asks for what it misses).
        assert await web.wait_for(1) == [("viewer", LOST)]
        assert web.links.dialed == {}
        # The worker no longer reaches the viewer over the cut link: the caller publishes instead.
        assert not await worker.links.send("viewer", "", b"lost")
        assert await web.links.send("tether.worker.w", "viewer", b"two")
        assert [data for _, data in await worker.wait_for(2)] == [b"one", b"two"]
        assert counted(metrics.LINK_RECONNECTS) == reconnects + 1
        assert await worker.links.send("viewer", "", b"back")
        assert await web.wait_for(2) == [("viewer", LOST), ("viewer", b"back")]


async def test_a_link_spoken_to_wrongly_closes_and_the_worker_serves_others(monkeypatch):
    async with worker_and_web() as (worker, web, address, worker_id):
        name = "\0" + address.removeprefix("unix:@")
        # Not the link protocol at all: refused in the handshake.
        reader, writer = await asyncio.open_unix_connection(name)
        assert (await reader.readexactly(len(MAGIC) + NONCE)).startswith(MAGIC)
        writer.write(b"GET / HTTP/1.1\r\n\r\n" + b"x" * 40)
        assert await reader.read() == b""
        writer.close()
        # Past the handshake, a frame larger than any message: the link closes, nothing is delivered.
        reader, writer = await asyncio.open_unix_connection(name)
        theirs = (await reader.readexactly(len(MAGIC) + NONCE))[len(MAGIC) :]
        mine = os.urandom(NONCE)
        writer.write(mine + link_module._mac(link_key(SECRET, worker_id), b"dial", theirs, mine))
        await reader.readexactly(MAC)
        writer.write(HEADER.pack(2**31, 5, 0) + b"chan!")
        assert await reader.read() == b""
        writer.close()
        assert worker.arrived == []
        # A real web process is still served.
        assert await web.links.send("tether.worker.w", "viewer", b"hello")
        assert await worker.wait_for(1) == [("tether.worker.w", b"hello")]


async def test_a_sender_past_the_links_budget_waits_for_room(monkeypatch):
    """A reader that stopped: the queue stops at the budget and the sender waits, memory does not grow."""
    monkeypatch.setattr(link_module, "QUEUE_BYTES", 1024 * 1024)
    async with worker_and_web() as (worker, web, _, _):
        assert await web.links.send("tether.worker.w", "viewer", b"attach")
        await worker.wait_for(1)
        link = next(iter(worker.links.accepted))
        dialled = web.links.dialed[next(iter(web.links.dialed))]
        dialled.writer.transport.pause_reading()  # the web process stops reading
        sending = asyncio.ensure_future(
            asyncio.gather(*(worker.links.send("viewer", "", struct.pack(">I", n) * 15_000) for n in range(200)))
        )
        await asyncio.sleep(1)
        assert not sending.done()
        assert link.queued <= 1024 * 1024 + 60_100
        dialled.writer.transport.resume_reading()
        assert all(await asyncio.wait_for(sending, 20))
        await web.wait_for(200)


async def test_a_viewer_not_heard_from_is_forgotten_and_the_link_stays(monkeypatch):
    """The worker keeps which link reaches a viewer's channel only while it hears from it (a viewer's socket sends
    a keepalive every few seconds): a daphne's thousands of viewers that came and went are not kept for the link's
    life."""
    monkeypatch.setattr(link_module, "PING_SECONDS", 0.05)
    monkeypatch.setattr(link_module, "REPLY_IDLE_SECONDS", 0.3)
    async with worker_and_web() as (worker, web, _, _):
        assert await web.links.send("tether.worker.w", "gone", b"attach")
        await worker.wait_for(1)
        assert "gone" in worker.links.replies
        for _ in range(10):  # another viewer keeps talking; the first says nothing more
            assert await web.links.send("tether.worker.w", "here", b"keepalive")
            await asyncio.sleep(0.06)
        assert "gone" not in worker.links.replies and "here" in worker.links.replies
        assert not await worker.links.send("gone", "", b"x")  # published instead
        assert len(worker.links.accepted) == 1


def test_a_message_put_on_a_link_whose_other_end_has_gone_is_refused_not_raised_on_uvloop():
    """The worker and daphne run uvloop, whose transports raise RuntimeError on a write once closed (asyncio's
    ignore it): the sender is told the link cannot take it (False: it goes through Redis) and the link is closed."""
    import socket

    import uvloop

    from transport.link import Link

    async def main() -> list[bool]:
        mine, theirs = socket.socketpair()
        reader, writer = await asyncio.open_unix_connection(sock=mine)
        link = Link(reader, writer, "dial", "the worker")
        link.start()
        theirs.close()
        # The first write fails in the kernel and uvloop closes the handle; the next, a turn of the loop later,
        # finds it closed before the read loop has heard of it.
        taken = []
        for _ in range(4):
            taken.append(await link.put("tether.worker.w", "", b"x" * 10))
            await asyncio.sleep(0)
        await asyncio.sleep(0.05)
        assert not link.is_open
        return taken

    taken = asyncio.Runner(loop_factory=uvloop.new_event_loop).run(main())
    assert taken[-1] is False, taken


@pytest.fixture(scope="module")
def certificates(tmp_path_factory) -> dict[str, str]:
    from tests.hosts.harness import link_certificates

    return link_certificates(tmp_path_factory.mktemp("link-tls"))


@contextlib.asynccontextmanager
async def over_tls(worker_tls: LinkTls, web_tls: LinkTls):
    """A worker listening on tls: behind a relay that keeps every byte it passes (the network between hosts)."""
    from tests.hosts.harness import LinkRelay

    relay = LinkRelay()
    spec = f"tls:127.0.0.1:{relay.port}"
    try:
        async with worker_and_web(spec, advertise="127.0.0.2", worker_tls=worker_tls, web_tls=web_tls) as ends:
            worker, web, address, _ = ends
            yield worker, web, address, relay
    finally:
        relay.close()


def mutual(certificates, who: str) -> LinkTls:
    return LinkTls(f"{certificates[who]}.pem", f"{certificates[who]}.key", certificates["ca.pem"])


async def test_between_hosts_over_tls_a_keystroke_is_not_on_the_wire_in_clear(certificates):
    async with over_tls(mutual(certificates, "worker"), mutual(certificates, "daphne")) as (
        worker,
        web,
        address,
        relay,
    ):
        assert address.startswith("tls:127.0.0.2:")
        assert await web.links.send("tether.worker.w", "viewer-1", b"my secret passphrase\r")
        assert await worker.wait_for(1) == [("tether.worker.w", b"my secret passphrase\r")]
        assert await worker.links.send("viewer-1", "", b"its echo: my secret passphrase")
        assert await web.wait_for(1) == [("viewer-1", b"its echo: my secret passphrase")]
        (link,) = worker.links.accepted
        assert link.writer.get_extra_info("ssl_object").version() in ("TLSv1.2", "TLSv1.3")
        assert relay.passed > 1000 and b"passphrase" not in relay.seen and b"tether.worker.w" not in relay.seen


async def test_over_tls_a_worker_whose_certificate_is_not_trusted_gets_nothing(certificates):
    """A daphne that trusts another CA (a worker impersonated on the network) does not link: Redis carries it."""
    web_tls = LinkTls(f"{certificates['daphne']}.pem", f"{certificates['daphne']}.key", certificates["other-ca.pem"])
    refused = counted(metrics.LINK_REFUSED)
    async with over_tls(mutual(certificates, "worker"), web_tls) as (worker, web, _, relay):
        assert not await web.links.send("tether.worker.w", "viewer-1", b"my secret passphrase\r")
        await refusals(refused + 1)  # the worker's side counts the handshake the daphne broke off
        assert worker.arrived == [] and b"passphrase" not in relay.seen


async def test_over_tls_a_daphne_without_a_certificate_the_worker_trusts_is_refused(certificates):
    """Mutual TLS: a worker given a CA takes links only from daphnes with a certificate it signed."""
    anonymous = LinkTls(ca=certificates["ca.pem"])
    refused = counted(metrics.LINK_REFUSED)
    async with over_tls(mutual(certificates, "worker"), anonymous) as (worker, web, _, _):
        assert not await web.links.send("tether.worker.w", "viewer-1", b"my secret passphrase\r")
        await refusals(refused + 1)  # counted where it was refused: the worker's /metrics says so
        assert worker.arrived == [] and worker.links.accepted == set()


async def test_a_dialler_speaking_no_tls_to_a_tls_worker_is_refused_and_counted(certificates):
    """Plain bytes (a daphne set up for tcp:, or anyone else) at a tls: worker: refused in the TLS handshake,
    counted and logged by the worker; nothing reaches it, and it goes on taking links that do speak TLS."""
    refused = counted(metrics.LINK_REFUSED)
    async with over_tls(mutual(certificates, "worker"), mutual(certificates, "daphne")) as (worker, web, address, _):
        host, port = address.removeprefix("tls:").rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(MAGIC + b"\0" * 64)
        answer = await asyncio.wait_for(reader.read(65536), 5)
        assert answer == b"" or answer[:1] == b"\x15", answer  # closed, at most with a TLS alert: nothing of ours
        writer.close()
        await refusals(refused + 1)
        assert worker.arrived == [] and worker.links.accepted == set()
        assert await web.links.send("tether.worker.w", "viewer-1", b"after")
        assert await worker.wait_for(1) == [("tether.worker.w", b"after")]
        assert counted(metrics.LINK_REFUSED) == refused + 1


async def test_a_tls_worker_closing_its_links_frees_its_port_and_ends_a_handshake_under_way(certificates):
    """A dialler that connected and said nothing is not left open until the handshake's timeout, and the port is
    free again once the links are closed (a worker restarted in place binds it at once)."""
    worker = End(tls=mutual(certificates, "worker"))
    address = await worker.links.listen(uuid.uuid4().hex, "tls:127.0.0.1:0")
    port = int(address.rsplit(":", 1)[1])
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    await asyncio.sleep(0.1)  # accepted: its handshake under way
    await worker.links.close()
    assert await asyncio.wait_for(reader.read(), 2) == b""
    writer.close()
    socket.create_server(("127.0.0.1", port)).close()


async def refusals(expected: float, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while counted(metrics.LINK_REFUSED) < expected:
            await asyncio.sleep(0.02)
    assert counted(metrics.LINK_REFUSED) == expected
