"""TLS for direct links between hosts (``tls:HOST:PORT``): what the link's own handshake does not give, secrecy on
the wire. Both ends are set up from the same three files: the worker presents ``cert`` and, when ``ca`` is given,
asks each dialling daphne for a certificate signed by it (mutual TLS); a daphne checks the worker's certificate
against ``ca`` (the system's authorities without one) and its name against the host it dials, and presents
``cert`` when it has one. The key proof of transport/link.py runs inside, as on any link."""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import ssl
from dataclasses import dataclass
from functools import cached_property

log = logging.getLogger(__name__)

ACCEPT_PAUSE_SECONDS = 1.0
PAUSE_ON = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}


@dataclass(frozen=True)
class LinkTls:
    cert: str = ""  # PEM: this end's certificate (a worker's is required), its chain after it
    key: str = ""  # PEM: its private key
    ca: str = ""  # PEM: the authorities the other end's certificate is checked against

    @classmethod
    def of(cls, cert: str, key: str, ca: str) -> LinkTls | None:
        return cls(cert, key or cert, ca) if cert or ca else None

    @cached_property
    def server(self) -> ssl.SSLContext:
        if not self.cert:
            raise ssl.SSLError("a worker listening on tls: needs TETHER_LINK_TLS_CERT")
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=self.ca or None)
        context.load_cert_chain(self.cert, self.key)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.verify_mode = ssl.CERT_REQUIRED if self.ca else ssl.CERT_NONE
        return context

    @cached_property
    def client(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.ca or None)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.cert:
            context.load_cert_chain(self.cert, self.key)
        return context


DEFAULT = LinkTls()  # a daphne with no TLS settings dialling a tls: address: the system's authorities


class TlsListener:
    """A ``tls:`` link listener that sees each refused handshake, where ``asyncio.start_server(ssl=…)`` drops it inside
    its TLS layer unseen: a connection is accepted plain and its handshake awaited here (``connect_accepted_socket``)
    before anything of it is read. (An accepted stream upgraded afterwards can lose the dialler's first bytes: uvloop
    starts reading a new transport at once, whatever its protocol asks.) ``accepted(reader, writer)`` gets each
    connection that completed its handshake, ``refused(peer, error)`` each that did not. It listens on every address
    HOST resolves to, as ``asyncio.start_server`` does."""

    def __init__(self, context: ssl.SSLContext, accepted, refused, handshake_seconds: float):
        self.context, self._accepted, self._refused = context, accepted, refused
        self.handshake_seconds = handshake_seconds
        self.sockets: list[socket.socket] = []
        self._tasks: set[asyncio.Task] = set()

    async def start(self, host: str, port: int) -> TlsListener:
        loop = asyncio.get_running_loop()
        found = await loop.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        try:
            for family, kind, protocol, _, address in dict.fromkeys(found):
                listener = socket.socket(family, kind, protocol)
                self.sockets.append(listener)
                listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:  # (its own address only: the IPv4 one has a socket of its own)
                    listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                listener.bind(address)
                listener.listen(128)
                listener.setblocking(False)
        except OSError:
            for listener in self.sockets:
                listener.close()
            raise
        for listener in self.sockets:
            self._spawn(self._serve(listener))
        return self

    def _spawn(self, work) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                try:
                    sock, peer = await loop.sock_accept(listener)
                except ConnectionAbortedError:
                    continue  # (the dialler gave up before it was accepted)
                except OSError as error:
                    if error.errno in PAUSE_ON:  # out of descriptors or memory: a pause, as asyncio's own servers
                        log.warning("could not accept a link: %r; trying again in %.0f s", error, ACCEPT_PAUSE_SECONDS)
                        await asyncio.sleep(ACCEPT_PAUSE_SECONDS)
                    continue  # (accept(2): other errors are the dialler's, to be retried at once)
                except Exception:  # never silently deaf: the worker goes on advertising this address
                    log.exception("accepting links failed; trying again in %.0f s", ACCEPT_PAUSE_SECONDS)
                    await asyncio.sleep(ACCEPT_PAUSE_SECONDS)
                    continue
                self._spawn(self._handshake(sock, peer))
        finally:  # (cancelled by close: the loop has let go of the socket first)
            listener.close()

    async def _handshake(self, sock: socket.socket, peer) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        protocol = asyncio.StreamReaderProtocol(reader)
        try:
            transport, _ = await loop.connect_accepted_socket(
                lambda: protocol, sock, ssl=self.context, ssl_handshake_timeout=self.handshake_seconds
            )
        except (ssl.SSLError, ConnectionError, OSError, TimeoutError) as error:
            sock.close()
            self._refused(str(peer), error)
            return
        except BaseException:  # (cancelled: the listener closed)
            sock.close()
            raise
        await self._accepted(reader, asyncio.StreamWriter(transport, protocol, reader, loop))

    def close(self) -> None:
        for task in self._tasks:
            task.cancel()

    async def wait_closed(self) -> None:
        """Until the listening sockets are closed (their port free again) and no handshake is left."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
