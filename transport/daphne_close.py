"""Two mends to daphne 4's WebSocket replies.

1. Close frames with their reason text. ASGI lets an application close a WebSocket
   with a code and a ``reason``; daphne (``WebSocketProtocol.handle_reply``) passes
   the code on and drops the reason. A superseded window should read why it was
   closed from the close frame itself (4001, "Superseded by another window"), as
   the protocol says, so the reason is passed to autobahn's ``sendClose``.
2. A send into a socket the browser has just closed is dropped. Between autobahn
   closing the connection and daphne telling the application (``websocket.disconnect``,
   which always follows) a send raised ``Disconnected`` inside the consumer: an
   ordinary close or takeover logged an ERROR with a traceback, and the consumer
   ended without its disconnect handler. Nothing can reach a closed socket anyway.

Everything else is left to daphne.
"""

from __future__ import annotations


def send_close_reasons() -> None:
    try:
        from daphne.ws_protocol import WebSocketProtocol
    except ImportError:  # not served by daphne: nothing to mend
        return
    if getattr(WebSocketProtocol, "tether_close_reasons", False):
        return
    plain = WebSocketProtocol.handle_reply

    def handle_reply(self, message):
        kind = message.get("type")
        if kind == "websocket.send" and self.state in (self.STATE_CLOSING, self.STATE_CLOSED):
            return  # the peer is gone; the application hears so from the disconnect that follows
        if kind == "websocket.close" and message.get("reason") and self.state != self.STATE_CONNECTING:
            # autobahn limits a reason to 123 bytes of UTF-8.
            reason = message["reason"].encode()[:123].decode(errors="ignore")
            self.sendClose(code=message.get("code") or 1000, reason=reason)
            return
        plain(self, message)

    WebSocketProtocol.handle_reply = handle_reply
    WebSocketProtocol.tether_close_reasons = True
