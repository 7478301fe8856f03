"""``/mcp`` in the ASGI application: the Origin checked (as for the site's sockets), the bearer token checked
and counted (as for every API call), then the MCP SDK's Streamable HTTP transport, stateless: every call is one
HTTP request that any web process behind the load balancer answers, with the token read again each time (a
revoked token is refused at its next call)."""

from __future__ import annotations

import asyncio
import logging

from channels.db import database_sync_to_async as db
from django.conf import settings
from django.http.request import split_domain_port, validate_host

from api.auth import authenticated
from api.models import ApiCall, ApiToken
from api.problems import ApiProblem, send_problem
from transport.origins import header_of, origin_allowed

log = logging.getLogger(__name__)

PATH = "/mcp"
START_SECONDS = 10.0


def _bearer(scope) -> str:
    kind, _, raw = header_of(scope, b"authorization").partition(" ")
    return raw.strip() if kind.lower() == "bearer" else ""


def _audit_refusal(token: ApiToken, method: str, problem: ApiProblem) -> None:
    try:
        ApiCall.objects.create(token=token, method=method[:8], path=PATH, status=problem.status, problem=problem.code)
    except Exception:
        log.exception("could not audit a refused MCP call")


def _host_allowed(scope) -> bool:
    """The Host is one of the site's (ALLOWED_HOSTS), as Django checks it for every other request."""
    host, _ = split_domain_port(header_of(scope, b"host"))
    return bool(host) and validate_host(host, settings.ALLOWED_HOSTS)


class McpEndpoint:
    """The MCP server's ASGI application (agents/tools.py gathers the tools)."""

    def __init__(self):
        self.ready: asyncio.Event | None = None
        self.holder: asyncio.Task | None = None
        self.manager = None

    async def __call__(self, scope, receive, send):
        if not _host_allowed(scope):
            return await send_problem(send, ApiProblem("invalid_request", "that Host is not this site's"))
        if scope.get("method") != "POST":
            # Stateless: every call is a POST. A GET would hold an empty event stream open (no server-sent
            # messages exist here) that no revoke could end.
            return await send_problem(send, ApiProblem("invalid_request", "the MCP endpoint takes POST", as_status=405),
                                 (b"allow", b"POST"))  # fmt: skip
        if header_of(scope, b"origin") and not origin_allowed(scope):  # another site's page (DNS rebinding, a fetch)
            return await send_problem(send, ApiProblem("forbidden", "this Origin may not call Tether's MCP server"))
        token, problem = await db(authenticated)(_bearer(scope))
        if problem is not None:
            if token is not None:
                await db(_audit_refusal)(token, scope.get("method", ""), problem)
            return await send_problem(send, problem)
        if not await self._running():
            text = "the MCP server is not running in this process (its log says why); try again"
            return await send_problem(send, ApiProblem("internal_error", text, as_status=503, retry_after=1))
        await self.manager.handle_request({**scope, "tether.token": token}, receive, send)

    async def _running(self) -> bool:
        """The SDK's session manager runs for the process's life, started by the first call (daphne sends no
        ASGI lifespan events). False when it could not start (logged; the next call tries again)."""
        if self.holder is None or self.holder.done():
            from agents.tools import server

            server._session_manager = None  # a manager runs once: a new one for each start
            server.streamable_http_app()  # builds the session manager with the server's settings
            self.manager = server.session_manager
            self.ready = asyncio.Event()
            self.holder = asyncio.get_running_loop().create_task(self._hold(), name="mcp-session-manager")
            self.holder.add_done_callback(self._ended)
        try:
            await asyncio.wait_for(self.ready.wait(), START_SECONDS)
        except TimeoutError:
            return False
        return not self.holder.done()

    async def _hold(self) -> None:
        async with self.manager.run():
            self.ready.set()
            await asyncio.Event().wait()

    def _ended(self, holder: asyncio.Task) -> None:
        if not holder.cancelled() and holder.exception() is not None:
            log.error("the MCP session manager stopped: %r", holder.exception(), exc_info=holder.exception())
        self.ready.set()  # whoever waits is told at once (and the next call starts another)


def with_mcp(http_app):
    """``http_app`` with ``/mcp`` served by the MCP endpoint (everything else as before)."""
    endpoint = McpEndpoint()

    async def app(scope, receive, send):
        if scope["type"] == "http" and scope["path"].rstrip("/") == PATH:
            return await endpoint(scope, receive, send)
        return await http_app(scope, receive, send)

    return app
