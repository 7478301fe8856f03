"""The terminal socket with an API token instead of a login cookie: ``Authorization: Bearer tether_…`` on the
handshake. The token needs the ``terminals`` scope; a revoked or expired one is refused at the handshake,
and a socket open when its token is revoked is closed (terminals.consumers)."""

from __future__ import annotations

from channels.db import database_sync_to_async as db
from channels.security.websocket import WebsocketDenier

from api.auth import usable
from api.models import ApiToken, Scope
from api.tokens import find_token, note_used, token_group


def bearer(scope) -> str:
    """The bearer token of a handshake, "" when it sends none."""
    for key, value in scope.get("headers", []):
        if key == b"authorization":
            kind, _, raw = value.decode("latin-1").partition(" ")
            return raw.strip() if kind.lower() == "bearer" else ""
    return ""


def _token_for(raw: str):
    token = find_token(raw)
    if usable(token) is not None or Scope.TERMINALS not in token.scopes:
        return None
    note_used(token)
    return token


class Credential:
    """What the terminal socket knows of the token it was opened with (it imports nothing of the API)."""

    def __init__(self, token: ApiToken):
        self.pk, self.name = token.pk, token.name
        self.group = token_group(token.pk)

    def ended(self) -> str:
        """ "", or why the token can no longer be used ("revoked", "expired")."""
        return ApiToken.objects.get(pk=self.pk).ended

    def token(self) -> ApiToken:
        """The token as it is now (access asks of it, not only of its user: it may be narrower)."""
        return ApiToken.objects.select_related("user").get(pk=self.pk)


class TokenAuthMiddleware:
    """Inside the cookie auth: a handshake with a bearer token is that token's user, whatever cookie it has."""

    def __init__(self, application):
        self.application = application

    async def __call__(self, scope, receive, send):
        if scope["type"] == "websocket" and (raw := bearer(scope)):
            token = await db(_token_for)(raw)
            if token is None:
                return await WebsocketDenier()(scope, receive, send)
            scope = dict(scope, user=token.user, credential=Credential(token))
        return await self.application(scope, receive, send)
