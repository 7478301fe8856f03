"""daphne's sockets write at once when nothing is queued ahead.

Twisted's ``FileDescriptor.write`` only queues: it registers the socket for writability and sends on the
reactor's next turn, then unregisters it. Under daphne (Twisted's asyncio reactor) every outgoing WebSocket
frame (a keystroke's echo among them) so cost two ``epoll_ctl`` calls, one more turn of the loop and a
reactor callback wrapped in Twisted's logging context, in the process that spends the most CPU per keystroke
(docs/benchmarks.md). Here a write to a TCP connection with nothing queued ahead is sent at once; whatever
the socket does not take now (or an error) goes Twisted's own way, queued for ``doWrite``, which also meets
an error again and closes the connection as before.
"""

from __future__ import annotations


def write_at_once() -> None:
    try:
        from twisted.internet import tcp
    except ImportError:  # not served by Twisted: nothing to change
        return
    if getattr(tcp.Connection, "tether_write_at_once", False):
        return
    queued = tcp.Connection.write  # Twisted's (with its TLS mixin's): queue, then write on doWrite

    def write(self, data: bytes) -> None:
        if (
            type(data) is bytes
            and data
            and not self.TLS  # started with startTLS: its TLS layer writes (daphne's TLS endpoints wrap instead)
            and self.connected
            and not self._writeDisconnected
            and not getattr(self, "_aborting", False)  # abortConnection() drops what comes after it
            # A pull producer is asked for more by doWrite once the queue empties: it keeps Twisted's way.
            # (HTTP and WebSocket connections register themselves as streaming producers.)
            and (self.producer is None or self.streamingProducer)
            and not self._tempDataBuffer
            and self.offset == len(self.dataBuffer)
        ):
            sent = self.writeSomeData(data)
            if type(sent) is int and sent >= 0:
                if sent == len(data):
                    return
                data = data[sent:]
        queued(self, data)

    tcp.Connection.write = write
    tcp.Connection.tether_write_at_once = True
