"""ASGI entry point: HTTP first (with /mcp, the MCP server), then WebSockets behind the Origin and auth checks."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.generic.websocket import AsyncWebsocketConsumer  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.conf import settings  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402
from django.urls import re_path  # noqa: E402

from agents.asgi import with_mcp  # noqa: E402
from api.ws import TokenAuthMiddleware  # noqa: E402
from files.asgi import limit_uploads  # noqa: E402
from recordings import routing as recording_sockets  # noqa: E402
from terminals import routing as terminal_sockets  # noqa: E402
from transport.daphne_close import send_close_reasons  # noqa: E402
from transport.origins import SameOriginValidator  # noqa: E402
from transport.twisted_write import write_at_once  # noqa: E402


class NoSuchSocket(AsyncWebsocketConsumer):
    """Any other WebSocket path: a plain refusal at the handshake (HTTP 403), not a 500 with a traceback
    that anyone, signed in or not, could fill the log with."""

    async def connect(self) -> None:
        await self.close()


sockets = URLRouter(
    [
        *terminal_sockets.websocket_urlpatterns,
        *recording_sockets.websocket_urlpatterns,
        re_path(r"", NoSuchSocket.as_asgi()),
    ]
)

send_close_reasons()
write_at_once()

http_app = ASGIStaticFilesHandler(django_asgi_app) if settings.SERVE_STATIC else django_asgi_app
http_app = with_mcp(limit_uploads(http_app))  # /mcp: the MCP server for agents (agents/asgi.py)

application = ProtocolTypeRouter(
    {
        "http": http_app,
        # Scheme, host and port of the Origin must be this site's (channels' own validator checks the host only);
        # an API client without an Origin is its bearer token's user (api/ws.py).
        "websocket": SameOriginValidator(AuthMiddlewareStack(TokenAuthMiddleware(sockets))),
    }
)
