"""``/mcp`` in the ASGI application: the Origin checked (as for the site's sockets), the bearer token checked
and counted (as for every API call), then the MCP SDK's Streamable HTTP transport, stateless: every call is one
HTTP request that any web process behind the load balancer answers, with the token read again each time (a
revoked token is refused at its next call)."""

from __future__ import annotations

import asyncio
import json
import logging

from channels.db import database_sync_to_async as db

from api.auth import check_rate, usable
from api.models import ApiCall, ApiToken
from api.problems import ApiProblem, problem_body
from api.tokens import find_token, note_used
from terminals.origins import origin_allowed

log = logging.getLogger(__name__)

PATH = "/mcp"


def _bearer(scope) -> str:
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            kind, _, raw = value.decode("latin-1").partition(" ")
            return raw.strip() if kind.lower() == "bearer" else ""
    return ""


def _authenticate(raw: str) -> tuple[ApiToken | None, ApiProblem | None]:
    """The call's token, or the problem to refuse it with (and the token when it is known, for the audit)."""
    if not raw:
        return None, ApiProblem("unauthenticated", "send the header Authorization: Bearer tether_…")
    token = find_token(raw)
    if problem := usable(token):
        return token, problem
    try:
        check_rate(token)
    except ApiProblem as problem:
        return token, problem
    note_used(token)
    return token, None


def _audit_refusal(token: ApiToken, method: str, problem: ApiProblem) -> None:
    try:
        ApiCall.objects.create(token=token, method=method[:8], path=PATH, status=problem.status, problem=problem.code)
    except Exception:
        log.exception("could not audit a refused MCP call")


async def _refuse(send, problem: ApiProblem) -> None:
    headers = [(b"content-type", b"application/problem+json"), (b"cache-control", b"no-store")]
    if problem.status == 401:
        headers.append((b"www-authenticate", b'Bearer realm="tether"'))
    if problem.retry_after is not None:
        headers.append((b"retry-after", str(problem.retry_after).encode()))
    body = json.dumps(problem_body(problem)).encode()
    await send({"type": "http.response.start", "status": problem.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class McpEndpoint:
    """The MCP server's ASGI application (agents/tools.py holds the tools)."""

    def __init__(self):
        self.ready: asyncio.Event | None = None
        self.holder: asyncio.Task | None = None
        self.manager = None

    async def __call__(self, scope, receive, send):
        sent_origin = any(name == b"origin" for name, _ in scope.get("headers", ()))
        if sent_origin and not origin_allowed(scope):  # a page of another site (DNS rebinding, a browser's fetch)
            return await _refuse(send, ApiProblem("forbidden", "this Origin may not call Tether's MCP server"))
        token, problem = await db(_authenticate)(_bearer(scope))
        if problem is not None:
            if token is not None:
                await db(_audit_refusal)(token, scope.get("method", ""), problem)
            return await _refuse(send, problem)
        await self._running()
        await self.manager.handle_request({**scope, "tether.token": token}, receive, send)

    async def _running(self) -> None:
        """The SDK's session manager runs for the process's life, started by the first call (daphne sends no
        ASGI lifespan events)."""
        if self.ready is None:
            from agents.tools import server

            server.streamable_http_app()  # builds the session manager with the server's settings
            self.manager = server.session_manager
            self.ready = asyncio.Event()
            self.holder = asyncio.get_running_loop().create_task(self._hold(), name="mcp-session-manager")
        await self.ready.wait()

    async def _hold(self) -> None:
        async with self.manager.run():
            self.ready.set()
            await asyncio.Event().wait()


def with_mcp(http_app):
    """``http_app`` with ``/mcp`` served by the MCP endpoint (everything else as before)."""
    endpoint = McpEndpoint()

    async def app(scope, receive, send):
        if scope["type"] == "http" and scope["path"].rstrip("/") == PATH:
            return await endpoint(scope, receive, send)
        return await http_app(scope, receive, send)

    return app
