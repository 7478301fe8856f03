"""Only the site's own pages may open a terminal socket: the Origin must be this very site (scheme, host and
port, as the browser addressed it) or one of ``CSRF_TRUSTED_ORIGINS``, as Django's CSRF check has it for a POST.

Channels' ``AllowedHostsOriginValidator`` compares the Origin's host name with ``ALLOWED_HOSTS`` only, so a page
served from another port or scheme of the same host (``http://127.0.0.1:9`` for a site on 8000) could drive a
user's shell with their cookie. Behind a TLS-terminating proxy the socket reaches daphne as plain ``ws``; the
proxy's scheme header (``SECURE_PROXY_SSL_HEADER``) says the browser used ``https``.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.http.request import split_domain_port, validate_host

DEFAULT_PORTS = {"http": "80", "https": "443"}


def _origin(scheme: str, netloc: str) -> tuple[str, str, str] | None:
    """(scheme, host, port) with the default port filled in; None when it is not an http(s) origin."""
    if scheme not in DEFAULT_PORTS or not netloc or "@" in netloc:
        return None
    host, port = split_domain_port(netloc)
    if not host:
        return None
    return scheme, host, port or DEFAULT_PORTS[scheme]


def header_of(scope, name: bytes) -> str:
    for key, value in scope.get("headers", []):
        if key == name:
            return value.decode("latin-1")
    return ""


def site_scheme(scope) -> str:
    """The scheme the browser used: https for wss (and an HTTPS request), or when the trusted proxy says so."""
    if scope.get("scheme") in ("wss", "https"):
        return "https"
    proxy = settings.SECURE_PROXY_SSL_HEADER
    if proxy:
        name, expected = proxy
        header = name.removeprefix("HTTP_").lower().replace("_", "-").encode()
        if header_of(scope, header).split(",")[0].strip() == expected:
            return "https"
    return "http"


def _trusted(origin: tuple[str, str, str]) -> bool:
    scheme, host, port = origin
    for entry in settings.CSRF_TRUSTED_ORIGINS:
        parts = urlsplit(entry)
        trusted = _origin(parts.scheme, parts.netloc.replace("*", "wildcard", 1))
        if trusted is None or trusted[0] != scheme or trusted[2] != port:
            continue
        pattern = trusted[1]
        if pattern == host or (pattern.startswith("wildcard.") and host.endswith(pattern.removeprefix("wildcard"))):
            return True
    return False


def origin_allowed(scope) -> bool:
    raw = header_of(scope, b"origin")
    if not raw:
        # Browsers always send one, so a socket without it is no page's: only an API client's, which must
        # then carry its token (api.ws refuses it without a valid one), never a cookie alone.
        return header_of(scope, b"authorization").lower().startswith("bearer ")
    parts = urlsplit(raw)
    origin = _origin(parts.scheme, parts.netloc)
    if origin is None:
        return False
    host_header = header_of(scope, b"host")
    site = _origin(site_scheme(scope), host_header)
    if site is not None and validate_host(site[1], settings.ALLOWED_HOSTS) and origin == site:
        return True
    return _trusted(origin)


class SameOriginValidator:
    """ASGI middleware: a WebSocket whose Origin is not this site is refused at the handshake (HTTP 403)."""

    def __init__(self, application):
        self.application = application

    async def __call__(self, scope, receive, send):
        if scope["type"] == "websocket" and not origin_allowed(scope):
            return await WebsocketDenier()(scope, receive, send)
        return await self.application(scope, receive, send)
