"""Direct links between a web process (daphne) and the owner workers it talks to: a session's input, output,
acks and resizes without Redis in the way.

A worker listens (``Links.listen``: an abstract unix socket on its host, or TCP between hosts) and advertises
the address in its worker row. A web process that sends to a worker's channel (``Links.route`` says where
that worker listens) dials it once and keeps that one link for every session it has with the worker. The
worker answers a viewer's channel over the link the viewer's messages came in on (each names its ``reply``
channel). Both ends put what arrives into the channel layer's own queue for the channel, so the consumers
and the worker receive as before. Redis keeps the wake-ups and group messages, and carries the stream where
no link can be made (``tether_link_fallbacks_total``, and a log line).

The semantics are the pub/sub layer's: at most once (a link that drops loses what was in it; offsets,
numbered input and resends make that good, as for a lost PUBLISH), and in order for one sender and channel.

Authenticated: each worker's key is derived from the install's secret and the worker's id (never stored,
never sent); both ends prove they hold it (an HMAC over nonces from both), so a process that now listens
at a stale address is refused, and nobody without the secret writes into a shell. Between hosts, ``tls:HOST:PORT``
adds secrecy on the wire (transport/link_tls.py: the worker's certificate checked, and with a CA the daphne's).

Interactive first: each (channel, reply) pair is a queue of its own; a queue whose next message is small
(a key, an echo, an ack) goes before any bulk, and bulk output takes turns between queues a message at a
time, so a keystroke's echo never waits behind another session's output. A link holds at most
``QUEUE_BYTES`` queued; a sender past it waits (the output flow control upstream rarely lets it get there).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable

from transport import metrics
from transport.link import (
    HANDSHAKE_SECONDS,
    Link,
    Refused,
    handshake_accept,
    handshake_dial,
    parse_address,
)
from transport.link_tls import DEFAULT, LinkTls, TlsListener

log = logging.getLogger(__name__)

DIAL_SECONDS = 2.0
RETRY_SECONDS = 5.0  # after a dial failed, Redis carries the stream this long before the next try (doubling
RETRY_MOST_SECONDS = 60.0  # with each failure in a row, up to this: an unreachable worker costs a wait rarely)
SETTLE_SECONDS = 0.1  # a link made while messages went through Redis: the last of those lands before the first


async def _open(family: str, where, tls: LinkTls) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    if family == "tcp":
        return await asyncio.open_connection(*where)
    if family == "tls":
        return await asyncio.open_connection(*where, ssl=tls.client, server_hostname=where[0])
    # The socket made here: uvloop takes no abstract name as a path (EINVAL).
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setblocking(False)
    try:
        await asyncio.get_running_loop().sock_connect(sock, where)
    except BaseException:
        sock.close()
        raise
    return await asyncio.open_unix_connection(sock=sock)


class Links:
    """One process's links (one event loop's). ``deliver(channel, data)`` puts a message that arrived into the
    layer's queue for ``channel``; ``key_for(worker_id)`` is that worker's link key."""

    def __init__(
        self,
        deliver: Callable[[str, bytes], None],
        key_for: Callable[[str], bytes],
        lost: Callable[[str], None] = lambda channel: None,
        tls: LinkTls | None = None,
    ):
        self._deliver, self._key_for, self._lost = deliver, key_for, lost
        self.tls = tls or DEFAULT
        self.routes: dict[str, tuple[str, str]] = {}  # a worker's channel -> (its address, its worker id)
        self.dialed: dict[str, Link] = {}  # worker id -> the link to it
        self._dialing: dict[str, asyncio.Future] = {}
        self._failed: dict[str, tuple[float, float]] = {}  # worker id -> (when a dial last failed, retry after)
        self._published: dict[str, float] = {}  # worker id -> when a message for it last went through Redis
        self._had: set[str] = set()  # worker ids this process had a link to (a new dial is a reconnect)
        self.replies: dict[str, Link] = {}  # (a worker) a viewer's channel -> the link its messages came on
        self.accepted: set[Link] = set()
        self.server: asyncio.AbstractServer | TlsListener | None = None
        self.address = ""

    # --- the worker's end ---------------------------------------------------------------------------

    async def listen(self, worker_id: str, spec: str, advertise: str = "") -> str:
        """Listen for links to ``worker_id``: ``spec`` ``unix`` (an abstract socket named for the worker) or
        ``tcp:HOST:PORT`` (PORT 0: any free one); returns the address to advertise (``advertise`` as its
        host for TCP, where HOST is not one others reach)."""
        key = self._key_for(worker_id)

        async def accepted(reader, writer):
            await self._accept(reader, writer, key)

        if spec == "unix":
            name = f"tether-link-{worker_id}"
            # The socket made here: uvloop takes no abstract name as a path (EINVAL).
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.bind("\0" + name)
            self.server = await asyncio.start_unix_server(accepted, sock=sock)
            self.address = f"unix:@{name}"
        else:
            family, (host, port) = parse_address(spec)
            if family == "tls":
                listener = TlsListener(self.tls.server, accepted, self._refused, HANDSHAKE_SECONDS)
                self.server = await listener.start(host, port)
            else:
                self.server = await asyncio.start_server(accepted, host, port, reuse_address=True)
            bound = self.server.sockets[0].getsockname()[1]
            shown = advertise or (host if host not in ("0.0.0.0", "::", "") else socket.gethostname())
            self.address = f"{family}:{'[' + shown + ']' if ':' in shown else shown}:{bound}"
        return self.address

    async def _accept(self, reader, writer, key: bytes) -> None:
        peer = str(writer.get_extra_info("peername") or "a local process")
        try:
            await asyncio.wait_for(handshake_accept(reader, writer, key), HANDSHAKE_SECONDS)
        except (Refused, asyncio.IncompleteReadError, TimeoutError, ConnectionError, OSError) as error:
            self._refused(peer, error)
            writer.close()
            return
        except BaseException:  # (cancelled: this process is closing its links)
            writer.close()
            raise
        link = Link(reader, writer, "accept", peer)
        link.deliver = self._arrived_at_worker
        link.on_close = self._accepted_closed
        link.on_forget = self._forget_reply
        self.accepted.add(link)
        link.start()

    @staticmethod
    def _refused(peer: str, error: BaseException) -> None:
        """A dialler that did not prove it holds the key, or (``tls:``) whose TLS handshake failed."""
        metrics.LINK_REFUSED.inc()
        log.warning("refused a link from %s: %s", peer, error if isinstance(error, Refused) else repr(error))

    def _arrived_at_worker(self, link: Link, channel: str, reply: str, data: bytes) -> None:
        if reply:
            link.replies[reply] = time.monotonic()
            self.replies[reply] = link
        self._deliver(channel, data)

    def _accepted_closed(self, link: Link) -> None:
        self.accepted.discard(link)
        for channel in link.replies:
            self._forget_reply(link, channel)

    def _forget_reply(self, link: Link, channel: str) -> None:
        if self.replies.get(channel) is link:
            del self.replies[channel]

    # --- the web process's end --------------------------------------------------------------------

    def route(self, channel: str, address: str, worker_id: str) -> None:
        """Messages to ``channel`` (a worker's) go over a link to ``address``, where ``worker_id`` listens."""
        if address and worker_id:
            self.routes[channel] = (address, worker_id)

    async def _dial(self, address: str, worker_id: str) -> Link | None:
        link = self.dialed.get(worker_id)
        if link is not None and link.is_open:
            return link
        failed, pause = self._failed.get(worker_id, (0.0, 0.0))
        if time.monotonic() - failed < pause:
            return None
        pending = self._dialing.get(worker_id)
        if pending is None:
            pending = self._dialing[worker_id] = asyncio.ensure_future(self._connect(address, worker_id))
            pending.add_done_callback(lambda _: self._dialing.pop(worker_id, None))
        return await asyncio.shield(pending)

    async def _connect(self, address: str, worker_id: str) -> Link | None:
        try:
            family, where = parse_address(address)
            reader, writer = await asyncio.wait_for(_open(family, where, self.tls), DIAL_SECONDS)
            try:
                await asyncio.wait_for(handshake_dial(reader, writer, self._key_for(worker_id)), HANDSHAKE_SECONDS)
            except BaseException:
                writer.close()
                raise
        except (Refused, ValueError, asyncio.IncompleteReadError, TimeoutError, ConnectionError, OSError) as error:
            pause = (
                min(RETRY_MOST_SECONDS, 2 * self._failed[worker_id][1]) if worker_id in self._failed else RETRY_SECONDS
            )
            self._failed[worker_id] = (time.monotonic(), pause)
            log.warning(
                "no link to worker %s at %s (%s): its sessions' streams go through Redis for %.0f s",
                worker_id,
                address,
                error if isinstance(error, Refused | ValueError) else repr(error),
                pause,
            )
            return None
        self._failed.pop(worker_id, None)
        if worker_id in self._had:
            metrics.LINK_RECONNECTS.inc()
        self._had.add(worker_id)
        link = Link(reader, writer, "dial", address)
        link.deliver = lambda link, channel, reply, data: self._deliver(channel, data)
        link.on_close = lambda link: self._dialed_closed(worker_id, link)
        self.dialed[worker_id] = link
        link.start()
        return link

    def _dialed_closed(self, worker_id: str, link: Link) -> None:
        """What was on the link is lost: each viewer that sent over it is told (``lost``), so it asks again for
        what it misses and says again what it has (a lost ack and a lost output together stalled a stream: the
        worker waited for the ack, the viewer for output)."""
        if self.dialed.get(worker_id) is link:
            del self.dialed[worker_id]
        for channel in link.replies:
            self._lost(channel)

    # --- both ---------------------------------------------------------------------------------------

    async def send(self, channel: str, reply: str, data: bytes) -> bool:
        """Send over a link if ``channel`` is reached by one; False: it is not (the caller publishes it)."""
        link = self.replies.get(channel)
        if link is None or not link.is_open:
            target = self.routes.get(channel)
            if target is None:
                return False
            worker_id = target[1]
            link = await self._dial(*target)
            if link is None:
                metrics.LINK_FALLBACKS.inc()
                self._published[worker_id] = time.monotonic()
                return False
            if (published := self._published.pop(worker_id, None)) is not None:
                # Messages went through Redis until now: the last of them lands first (a key typed then must
                # not be overtaken by the next one here: the worker writes each number once, in order).
                link.hold_until = published + SETTLE_SECONDS
        return await link.put(channel, reply, data)

    async def close(self) -> None:
        if (server := self.server) is not None:
            self.server = None
            server.close()
            if isinstance(server, TlsListener):  # (its port free again; asyncio's Server frees it at once)
                await server.wait_closed()
        for link in [*self.dialed.values(), *self.accepted]:
            link.close("this process is closing its links")
