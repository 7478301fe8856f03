"""Close frames with their reason text under daphne.

ASGI lets an application close a WebSocket with a code and a ``reason``; daphne 4
(``WebSocketProtocol.handle_reply``) passes the code on and drops the reason. A
superseded window should read why it was closed from the close frame itself
(4001, "Superseded by another window"), as the protocol says, so the reason is
passed to autobahn's ``sendClose``, which takes one. Everything else is left to
daphne.
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
        if message.get("type") == "websocket.close" and message.get("reason") and self.state != self.STATE_CONNECTING:
            # autobahn limits a reason to 123 bytes of UTF-8.
            reason = message["reason"].encode()[:123].decode(errors="ignore")
            self.sendClose(code=message.get("code") or 1000, reason=reason)
            return
        plain(self, message)

    WebSocketProtocol.handle_reply = handle_reply
    WebSocketProtocol.tether_close_reasons = True
