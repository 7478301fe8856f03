"""daphne's sockets write at once when nothing is queued (transport/twisted_write.py): what the socket does not
take at once is still sent whole and in order, and a peer that goes away is still seen as gone.

Run in a process of its own: Twisted's reactor runs once per process."""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SERVER = r"""
import hashlib, os, sys
from twisted.internet import asyncioreactor
asyncioreactor.install()
from twisted.internet import protocol, reactor
from transport.twisted_write import write_at_once

write_at_once()
pieces = [os.urandom(size) for size in [1, 10, 100, 1000, 65536, 300000, 7, 1 << 20] * 2]
digest = hashlib.sha256(b"".join(pieces)).hexdigest()

class Talker(protocol.Protocol):
    def connectionMade(self):
        self.transport.setTcpNoDelay(True)
        queued = []
        start = self.transport.startWriting
        self.transport.startWriting = lambda: (queued.append(1), start())
        self.transport.write(b"hello")  # nothing queued ahead: sent at once, never left for the next turn
        print("queued", len(queued), flush=True)
        del self.transport.startWriting
        self.send()

    def send(self):
        for piece in pieces:  # written one after another, most while earlier ones are still queued
            self.transport.write(piece)
        print("written", digest, flush=True)

    def dataReceived(self, data):
        self.send()  # again, once all was sent: the socket's queue had emptied

    def connectionLost(self, reason):
        print("lost", reason.type.__name__, flush=True)
        reactor.callLater(0.1, reactor.stop)

port = reactor.listenTCP(0, protocol.Factory.forProtocol(Talker), interface="127.0.0.1")
print("port", port.getHost().port, flush=True)
reactor.run()
"""


def test_writes_past_what_the_socket_takes_arrive_whole_and_in_order_and_a_gone_peer_is_seen():
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER], cwd=ROOT, stdout=subprocess.PIPE, text=True, env=os.environ
    )
    try:
        port = int(server.stdout.readline().split()[1])
        client = socket.socket()
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # so most writes meet a full socket
        client.connect(("127.0.0.1", port))
        assert server.stdout.readline().split() == ["queued", "0"]
        assert client.recv(5) == b"hello"
        total = sum([1, 10, 100, 1000, 65536, 300000, 7, 1 << 20]) * 2
        for _round in range(2):
            said = server.stdout.readline().split()
            assert said[0] == "written"
            got = bytearray()
            while len(got) < total:
                time.sleep(0.001)  # a slow reader
                data = client.recv(65536)
                assert data, f"closed after {len(got)} of {total} bytes"
                got += data
            assert hashlib.sha256(got).hexdigest() == said[1]
            client.sendall(b"again")
        assert server.stdout.readline().split()[0] == "written"  # a third round, queued: the client leaves
        client.close()
        assert server.stdout.readline().split()[0] == "lost"
        assert server.wait(10) == 0
    finally:
        server.kill()


PULL = r"""
from twisted.internet import asyncioreactor
asyncioreactor.install()
from twisted.internet import protocol, reactor
from zope.interface import implementer
from twisted.internet.interfaces import IPullProducer
from transport.twisted_write import write_at_once

write_at_once()

@implementer(IPullProducer)
class Pieces:
    def __init__(self, transport):
        self.transport, self.left = transport, 5

    def resumeProducing(self):  # asked for one more piece each time the socket has taken the last
        self.transport.write(b"piece%d;" % (6 - self.left))
        self.left -= 1
        if not self.left:
            self.transport.unregisterProducer()
            self.transport.loseConnection()

    def stopProducing(self):
        pass

class Talker(protocol.Protocol):
    def connectionMade(self):
        self.transport.registerProducer(Pieces(self.transport), False)

    def connectionLost(self, reason):
        reactor.callLater(0.1, reactor.stop)

port = reactor.listenTCP(0, protocol.Factory.forProtocol(Talker), interface="127.0.0.1")
print("port", port.getHost().port, flush=True)
reactor.run()
"""


def test_a_pull_producer_is_still_asked_for_more_until_it_is_done():
    """Sent at once, a pull producer's write never reached doWrite, which asks it for the next piece: the
    connection stalled after the first (found in review)."""
    server = subprocess.Popen([sys.executable, "-c", PULL], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline().split()[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
            got = b""
            while data := client.recv(1024):
                got += data
        assert got == b"piece1;piece2;piece3;piece4;piece5;"
        assert server.wait(10) == 0
    finally:
        server.kill()
