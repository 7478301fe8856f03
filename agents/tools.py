"""The MCP server's tools. Each one is a call of the HTTP API (api/executions.py, api/terminals.py), made with
the caller's bearer token: the same scopes, the same access decision, the same refusals (a tool error carries
the API's problem), the same audit trail (an ``ApiCall`` per tool call). Nothing here decides access itself.

Honesty, in an agent's terms: a command's exit is said only when the program's own exit was observed or read
back; otherwise it is ``unknown``, awaits an operator, and is never reported as completed or failed."""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async as db
from mcp.server.fastmcp.exceptions import ToolError
from mcp.shared.exceptions import McpError
from mcp.types import INVALID_PARAMS, ErrorData

from agents import command_tools, tasks, terminal_tools  # noqa: F401  (each registers its tools on ``server``)
from agents.command_tools import _outcome
from agents.server import _Call, _serve, server
from api import executions as api_executions

__all__ = ["server"]


def _strict(tools: Any) -> None:
    """Every tool's arguments are exactly those it names (an unknown one is refused, as the API's fields)."""
    for tool in tools:
        tool.parameters["additionalProperties"] = False


_strict(server._tool_manager.list_tools())


async def _serve_task(name: str, work):
    """A tasks/… request: its caller's call, audited; a refusal is the request's error, with its problem."""
    try:
        return await _serve(server.get_context(), name, work)
    except ToolError as error:
        raise McpError(ErrorData(code=INVALID_PARAMS, message=str(error))) from None


async def _cancel(call: _Call, pk: int) -> None:
    await db(api_executions.cancel)(call, pk, api_executions.CancelIn(reason="cancelled as an MCP task"))


tasks.register(server._mcp_server, _serve_task, _outcome, _cancel)
