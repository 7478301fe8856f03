"""The MCP server (the SDK's FastMCP, stateless, JSON answers) and what every tool goes through: the caller's
token, an audited call of the HTTP API, a refusal said as the API's problem. The tools are in
command_tools.py and terminal_tools.py; agents/tools.py gathers them."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from channels.db import database_sync_to_async as db
from mcp.server.fastmcp import Context, FastMCP
from mcp.server.fastmcp.exceptions import ToolError
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import McpError
from mcp.types import (
    INVALID_PARAMS,
    CallToolRequest,
    CallToolResult,
    CreateTaskResult,
    ErrorData,
    Task,
    TextContent,
    ToolExecution,
)
from ninja import Status
from pydantic import BaseModel
from pydantic import ValidationError as Invalid

from agents import tasks
from api.api import invalid, problem_of
from api.models import ApiCall, ApiToken
from api.problems import ApiProblem, problem_body
from executions.models import Execution

log = logging.getLogger(__name__)

INSTRUCTIONS = """\
Tether runs commands and shells on machines (docker containers and hosts) for you, durably.
- run_command is idempotent by (scope, id): call it again after a lost answer and the same execution comes
  back; nothing runs twice. Pick a new id for a new command.
- An outcome is 'completed' with an exit code only when the program's own exit was seen. 'unknown' means
  nobody can tell yet (its worker was lost): it awaits an operator, and the command may still be running.
  Do not treat it as a failure or a success, and do not run it again under a new id unless that is safe.
- Output is read by byte offset (read_output: since -> next); 'lost' counts bytes no longer kept.
- run_command with pty: false runs it on pipes: stdout and stderr apart (read_output's stream), stdin
  written with write_stdin (numbered like keys) and closed with eof.
- Terminals: open_terminal, send_keys with your own increasing seq (a retry with the same seq is written
  once), read_screen, close_terminal."""


class _Call:
    """What the API's calls read of a request: the token (and its user). No cookies, no headers."""

    def __init__(self, token: ApiToken):
        self.auth = token
        self.user = token.user
        self.headers: dict[str, str] = {}


class _Server(FastMCP):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        handlers = self._mcp_server.request_handlers
        answer_tool = handlers[CallToolRequest]

        async def answer(request: CallToolRequest):
            """A refused call made as a task is a JSON-RPC error (its caller waits for a task, not a result)."""
            result = await answer_tool(request)
            if request.params.task is not None and getattr(result.root, "isError", False):
                raise McpError(ErrorData(code=INVALID_PARAMS, message=result.root.content[0].text))
            return result

        handlers[CallToolRequest] = answer

    async def list_tools(self):
        """``run_command`` may be called as a task (agents/tasks.py)."""
        listed = await super().list_tools()
        for tool in listed:
            if tool.name == "run_command":
                tool.execution = ToolExecution(taskSupport="optional")
        return listed

    async def call_tool(self, name: str, arguments: dict[str, Any]):
        """An argument a tool does not name is refused (as an unknown field of the API), never dropped."""
        tool = self._tool_manager.get_tool(name)
        if tool is None:
            await self._refuse(name, ApiProblem("not_found", f"no tool {name[:100]!r} (tools/list names them)"))
        unknown = sorted(set(arguments or {}) - set(tool.parameters.get("properties", {})))
        if unknown:
            names = ", ".join(repr(argument) for argument in unknown)
            await self._refuse(name, ApiProblem("unknown_fields", f"{name} takes no argument {names}", fields=unknown))
        try:
            answer = await super().call_tool(name, arguments)
        except ToolError as error:  # the SDK wraps what a tool raised in a sentence of its own
            if isinstance(error.__cause__, ToolError):  # a refusal, said as its problem (_serve)
                raise error.__cause__ from None
            if isinstance(error.__cause__, Invalid):  # arguments that do not fit the tool's schema
                await self._refuse(name, invalid(error.__cause__.errors()))
            raise
        if name == "run_command" and self._mcp_server.request_context.experimental.is_task:
            # Called as a task: the execution is the task (agents/tasks.py); it was submitted, not waited for.
            record = answer.structuredContent["execution"]
            execution = await db(Execution.objects.select_related("machine").get)(pk=record["id"])
            return CreateTaskResult(task=Task(**tasks.task_of(execution)))
        return answer

    async def _refuse(self, tool: str, problem: ApiProblem):
        await db(_audit)(_token(self.get_context()), tool[:100], problem.status, problem.code, time.monotonic())
        raise ToolError(_said(problem)) from None


server = _Server(
    "tether",
    instructions=INSTRUCTIONS,
    stateless_http=True,  # any daphne behind the load balancer answers any call
    json_response=True,
    streamable_http_path="/mcp",
    # The Origin is checked before this (agents/asgi.py, as for the site's sockets): the SDK's own check
    # allows only localhost names, which a deployment behind a proxy is not.
    transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
)


def _token(ctx: Context) -> ApiToken:
    return ctx.request_context.request.scope["tether.token"]


def _audit(token: ApiToken, tool: str, status: int, problem: str, started: float) -> None:
    try:
        ApiCall.objects.create(
            token=token,
            method="MCP",
            path=(f"/mcp {tool}" if "/" in tool else f"/mcp tools/call {tool}")[:300],
            status=status,
            problem=problem[:40],
            milliseconds=min(int((time.monotonic() - started) * 1000), 2**31 - 1),
        )
    except Exception:  # the answer stands; a lost audit line is logged, never raised at the caller
        log.exception("could not audit the MCP call %s", tool)


async def _serve(ctx: Context, tool: str, work):
    """Run ``work(call)`` for the caller; a refusal becomes the tool's error, with the API's problem in it."""
    token, started = _token(ctx), time.monotonic()
    call = _Call(token)
    try:
        result = await work(call)
    except Exception as error:
        problem = await db(problem_of)(error, call.auth)
        if problem is None:  # a bug of ours, never blamed on the caller's arguments
            log.exception("MCP tool %s failed", tool)
            problem = ApiProblem("internal_error", "the server failed; the error is in its log")
        await db(_audit)(token, tool, problem.status, problem.code, started)
        raise ToolError(_said(problem)) from None
    await db(_audit)(token, tool, 200, "", started)
    return result


def _said(problem: ApiProblem) -> str:
    """A refusal as the tool's error text: the code first (what to branch on), then the API's problem."""
    return f"{problem.code}: {problem.detail}\n{json.dumps(problem_body(problem), separators=(',', ':'))}"


def _input(schema: type[BaseModel], **fields):
    """The API's input schema, filled from a tool's arguments: what does not fit is the caller's, said so."""
    try:
        return schema(**fields)
    except Invalid as error:
        raise invalid(error.errors()) from None


def _value(answer):
    return answer.value if isinstance(answer, Status) else answer


def _result(text: str, structured: BaseModel | dict) -> CallToolResult:
    if isinstance(structured, BaseModel):
        structured = structured.model_dump(mode="json")
    return CallToolResult(content=[TextContent(type="text", text=text)], structuredContent=structured)
