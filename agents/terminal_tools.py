"""The MCP tools for a terminal session: open, numbered keys, the screen as text, close; each one a call of
the HTTP API (api/terminals.py) made with the caller's token (agents/server.py)."""

from __future__ import annotations

import uuid
from typing import Annotated

from channels.db import database_sync_to_async as db
from mcp.server.fastmcp import Context
from mcp.types import (
    CallToolResult,
    ToolAnnotations,
)
from pydantic import BaseModel, Field

from agents.command_tools import Reason
from agents.screen import Screen, render
from agents.server import _input, _result, _serve, server
from api import terminals as api_terminals
from api.inputs import InputOut

SCREEN_BYTES = 256 * 1024  # a screen is rebuilt from at most this much of the output's end


# --- terminals --------------------------------------------------------------------------------------------------


class Opened(BaseModel):
    created: bool = Field(description="False: the machine's open shell of yours was reattached")
    terminal: api_terminals.TerminalOut


Terminal = Annotated[uuid.UUID, Field(description="The terminal's id (terminal.id from open_terminal)")]


@server.tool(
    title="Open a terminal",
    annotations=ToolAnnotations(readOnlyHint=False, destructiveHint=False, idempotentHint=True, openWorldHint=False),
)
async def open_terminal(
    ctx: Context, machine: Annotated[str, Field(description="A workspace's name (list_workspaces)")]
) -> Annotated[CallToolResult, Opened]:
    """Open a shell on a machine, or reattach to your open one there. It lives on its own (a worker holds it),
    across your disconnects, until you close it."""

    async def work(call):
        answer = await db(api_terminals.open_terminal)(call, _input(api_terminals.OpenIn, machine=machine))
        opened = Opened(**answer.value)
        said = "opened" if opened.created else "reattached"
        return _result(f"terminal {opened.terminal.id} on {machine}: {said}", opened)

    return await _serve(ctx, "open_terminal", work)


SEQ = "Your number for these keys: 1, 2, 3, ... A retry with the same seq and keys is written once"


@server.tool(
    title="Type into a terminal",
    annotations=ToolAnnotations(readOnlyHint=False, destructiveHint=True, idempotentHint=True, openWorldHint=False),
)
async def send_keys(
    ctx: Context,
    terminal: Terminal,
    seq: Annotated[int, Field(ge=0, le=2**53, description=SEQ)],
    keys: Annotated[str | None, Field(description="Keys as text; Enter is \\r")] = None,
    keys_b64: Annotated[str | None, Field(description="Keys as base64 (bytes that are not text)")] = None,
    client: Annotated[
        str, Field(max_length=100, description="Which of your programs types (numbers are per client, as the API's)")
    ] = "",
) -> Annotated[CallToolResult, InputOut]:
    """Type keys into your terminal, at most once per seq: the next seq is one more than the last; a repeated
    seq with the same keys is not written again (input_conflict with other keys, input_gap out of order)."""

    async def work(call):
        body = _input(api_terminals.InputIn, seq=seq, data=keys, data_b64=keys_b64, client=client)
        answer = InputOut(**await api_terminals.terminal_input(call, terminal, body))
        said = "written before (not again)" if answer.repeated else "written"
        return _result(f"keys {seq}: {said}", answer)

    return await _serve(ctx, "send_keys", work)


@server.tool(
    title="Read a terminal's screen",
    annotations=ToolAnnotations(readOnlyHint=True, destructiveHint=False, idempotentHint=True, openWorldHint=False),
)
async def read_screen(ctx: Context, terminal: Terminal) -> Annotated[CallToolResult, Screen]:
    """The terminal's screen as text (its rows, the cursor), as a terminal would show it now."""

    async def work(call):
        screen = await render(call, terminal, SCREEN_BYTES)
        return _result(screen.said(), screen)

    return await _serve(ctx, "read_screen", work)


@server.tool(
    title="Close a terminal",
    annotations=ToolAnnotations(readOnlyHint=False, destructiveHint=True, idempotentHint=True, openWorldHint=False),
)
async def close_terminal(
    ctx: Context,
    terminal: Terminal,
    reason: Reason = "",
) -> Annotated[CallToolResult, api_terminals.TerminalOut]:
    """End the terminal's shell; the session closes with its outcome."""

    async def work(call):
        answer = await db(api_terminals.terminal_close)(call, terminal, _input(api_terminals.ReasonIn, reason=reason))
        closed = api_terminals.TerminalOut(**answer.value)
        return _result(f"terminal {terminal}: {closed.process_state}", closed)

    return await _serve(ctx, "close_terminal", work)
