from channels.generic.websocket import AsyncWebsocketConsumer
from django.urls import path, re_path

from terminals.consumers import TerminalConsumer
from terminals.share_consumer import SharedTerminalConsumer


class NoSuchSocket(AsyncWebsocketConsumer):
    """Any other WebSocket path: a plain refusal at the handshake (HTTP 403), not a 500 with a traceback
    that anyone, signed in or not, could fill the log with."""

    async def connect(self) -> None:
        await self.close()


websocket_urlpatterns = [
    path("ws/terminals/<uuid:session>/", TerminalConsumer.as_asgi()),
    path("ws/shares/<str:token>/", SharedTerminalConsumer.as_asgi()),
    re_path(r"", NoSuchSocket.as_asgi()),
]
