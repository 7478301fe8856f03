"""The MCP tools for workspaces and commands: each one a call of the HTTP API (api/executions.py,
api/output.py, api/inputs.py) made with the caller's token (agents/server.py)."""

from __future__ import annotations

import base64
import logging
from typing import Annotated, Literal

from channels.db import database_sync_to_async as db
from mcp.server.fastmcp import Context
from mcp.types import (
    CallToolResult,
    ToolAnnotations,
)
from pydantic import BaseModel, Field

from agents.server import _Call, _input, _result, _serve, _value, server
from api import executions as api_executions
from api import inputs as api_inputs
from api import output as api_output
from api.auth import need
from api.inputs import InputOut
from api.models import Scope
from api.output import READ_BYTES, OutputOut, read_output
from api.problems import ApiProblem
from api.seen import MAX_WAIT, Awaiting, ExecutionOut, visible
from executions import pipes
from executions.actions.common import IDENTITY
from executions.models import Execution, Machine
from executions.spec import MAX_ARGV_BYTES
from terminals.protocol import MAX_INTEGER

log = logging.getLogger(__name__)

HEAD_BYTES = 4 * 1024  # an output's text in a result: its first bytes ...
TAIL_BYTES = 12 * 1024  # ... and its last, with how many between were left out
SCREEN_BYTES = 256 * 1024  # a screen is rebuilt from at most this much of the output's end


# --- workspaces ------------------------------------------------------------------------------------------------


class Slot(BaseModel):
    held: bool = Field(description="A command or a shell holds the machine's one command slot")
    by: str = Field(description="'you', 'another user' (never who, nor what), or '' when free")
    execution: int | None = Field(None, description="Yours: the execution that holds it")
    label: str = Field("", description="Yours: its (scope/id)")
    state: str = Field("", description="The holder's state (pending, dispatched, running, unknown)")


class Workspace(BaseModel):
    name: str
    backend: str = Field(description="docker, local (a host shell) or tmux (a host shell in tmux)")
    state: str = Field(description="running, stopped, deleted or unknown")
    scope: str
    role: str = Field(description="Your role on it: watch, use or operate")
    labels: dict[str, str]
    slot: Slot


class Workspaces(BaseModel):
    workspaces: list[Workspace]


def _workspaces(call: _Call) -> Workspaces:
    """The API's machine listing (GET /machines), each with who holds its slot in words this person may see."""
    listed = api_executions.machines(call)
    holders = dict(Machine.objects.filter(name__in=[m["name"] for m in listed]).values_list("name", "active_execution"))
    yours = {e.pk: e for e in visible(call.auth).filter(pk__in=[pk for pk in holders.values() if pk])}
    states = dict(Execution.objects.filter(pk__in=holders.values()).values_list("pk", "state"))  # another's: no name
    found = []
    for machine in listed:
        pk = holders.get(machine["name"])
        if pk is None:
            slot = Slot(held=False, by="")
        elif pk in yours:
            mine = yours[pk]
            slot = Slot(held=True, by="you", execution=pk, label=f"{mine.scope}/{mine.execution_id}", state=mine.state)
        else:
            slot = Slot(held=True, by="another user", state=states.get(pk, ""))
        found.append(Workspace(**{k: v for k, v in machine.items() if k != "busy"}, slot=slot))
    return Workspaces(workspaces=found)


@server.tool(
    title="List workspaces",
    annotations=ToolAnnotations(readOnlyHint=True, idempotentHint=True, destructiveHint=False, openWorldHint=False),
)
async def list_workspaces(ctx: Context) -> Annotated[CallToolResult, Workspaces]:
    """The machines (docker containers, host shells) you may reach: backend, state, your role, and who holds
    the command slot (you, or another user, never who)."""

    async def work(call):
        found = await db(_workspaces)(call)
        lines = [
            f"{w.name} ({w.backend}, {w.state}, you {w.role}): "
            + (f"slot held by {w.slot.by}" + (f": execution {w.slot.execution} {w.slot.label}" if w.slot.execution
               else "") + f" ({w.slot.state})" if w.slot.held else "slot free")
            for w in found.workspaces
        ]  # fmt: skip
        return _result("\n".join(lines) or "no machine you may reach", found)

    return await _serve(ctx, "list_workspaces", work)


# --- commands -------------------------------------------------------------------------------------------------


class OutputText(BaseModel):
    available: bool = Field(True, description="False: not read just now (`text` says why): read_output reads it")
    text: str = Field(description="The output as UTF-8: its first and last bytes, what was left out between said")
    end: int = Field(description="Bytes of output known so far (read on from here with read_output)")
    first_kept: int = Field(description="The first offset still kept")
    lost: int = Field(description="Bytes at the start no longer kept")
    omitted: int = Field(description="Bytes left out of `text` between its head and its tail (read_output has them)")


class CommandOutcome(BaseModel):
    created: bool | None = Field(None, description="run_command: False when this (scope, id) had been submitted")
    final: bool = Field(description="The record will not change again (completed, cancelled, resolved)")
    awaiting: str = Field(description="nothing (final), start, program (it runs) or operator (unknown outcome)")
    detail: str
    operator_must_check: str = Field("", description="For an unknown outcome: what an operator has to establish")
    execution: ExecutionOut
    output: OutputText = Field(description="Its output (a command on pipes: both streams, in the order they came)")
    stdout: OutputText | None = Field(None, description="A command on pipes (pty: false): its stdout alone")
    stderr: OutputText | None = Field(None, description="... and its stderr alone")


async def _output_text(call: _Call, pk: int, view: pipes.View | None = None) -> OutputText:
    viewer = f"api:{call.auth.pk}"

    def load():
        return api_output._still_mine(call, pk)

    try:
        first = await read_output(load, 0, HEAD_BYTES, 0.0, viewer, view)
        head = base64.b64decode(first["data"])
        at, end, omitted, tail = first["next"], first["end"], 0, b""
        if end - at > TAIL_BYTES:
            omitted, at = end - TAIL_BYTES - at, end - TAIL_BYTES
        while at < end:
            piece = await read_output(load, at, min(READ_BYTES, end - at), 0.0, viewer, view)
            if not (piece["data"] or piece["lost"]):
                break
            omitted += piece["lost"]
            tail += base64.b64decode(piece["data"])
            at = piece["next"]
    except ApiProblem as problem:  # the record is still said: the output is read again with read_output
        text = f"[output not read just now: {problem.code}: {problem.detail}]"
        return OutputText(available=False, text=text, end=0, first_kept=0, lost=0, omitted=0)
    text = head.decode("utf-8", "replace")
    if first["lost"]:
        text = f"[{first['lost']} bytes at the start are no longer kept]\n" + text
    if omitted:
        text += f"\n[... {omitted} bytes left out here: read_output has them ...]\n"
    text += tail.decode("utf-8", "replace")
    return OutputText(text=text, end=end, first_kept=first["first_kept"], lost=first["lost"], omitted=omitted)


def _operator_check(machine: str) -> str:
    return (
        f"Whether the command still runs on machine {machine}, or how it ended (its worker was "
        "lost, so nobody saw its end). An operator checks the machine and resolves it (exec_resolve, or the "
        "admin); until then no exit code is known. Do not run it again unless running it twice is safe."
    )


async def _outcome(
    call: _Call, pk: int, wait: float, created: bool | None = None, with_output: bool = True
) -> CallToolResult:
    awaited = await api_executions.await_execution(call, pk, wait)
    on_pipes = not awaited["execution"]["pty"]
    streams: dict[str, OutputText | None] = {"stdout": None, "stderr": None}
    if with_output:
        output = await _output_text(call, pk, pipes.View.ALL if on_pipes else None)
        if on_pipes:
            streams = {name: await _output_text(call, pk, pipes.View(name)) for name in streams}
    else:
        output = OutputText(available=False, text="", end=0, first_kept=0, lost=0, omitted=0)
    check = _operator_check(awaited["execution"]["machine"]) if awaited["awaiting"] == Awaiting.OPERATOR else ""
    outcome = CommandOutcome(created=created, final=awaited["final"], awaiting=awaited["awaiting"],
                             detail=awaited["detail"], operator_must_check=check, execution=awaited["execution"],
                             output=output, **streams)  # fmt: skip
    record = awaited["execution"]
    said = f"execution {record['id']} ({record['scope']}/{record['execution_id']}) on {record['machine']}: "
    said += record["state"].upper() if record["state"] == "unknown" else record["outcome"]
    lines = [said, f"{'final' if outcome.final else 'not final'}: {outcome.detail}"]
    if created is False:
        lines.append("(submitted before under this scope and id: nothing ran again)")
    if check:
        lines.append(f"an operator must check: {check}")
    if on_pipes and with_output:
        for name, text in streams.items():
            lines += [f"{name} ({text.end} bytes):" if text.available else f"{name}:", text.text]
        return _result("\n".join(lines), outcome)
    lines.append(f"output ({output.end} bytes):" if output.available else "output:")
    return _result("\n".join([*lines, output.text]), outcome)


ARGV = f"The program and its arguments ({MAX_ARGV_BYTES} bytes at most); a shell line: ['sh', '-c', 'LINE']"
IDENTITY_WORDS = "A letter or digit, then letters, digits and . _ : @ / -"
Identity = Annotated[str, Field(min_length=1, max_length=200, pattern=IDENTITY.pattern, description=IDENTITY_WORDS)]


@server.tool(
    title="Run a command",
    annotations=ToolAnnotations(readOnlyHint=False, destructiveHint=True, idempotentHint=True, openWorldHint=True),
)
async def run_command(
    ctx: Context,
    machine: Annotated[str, Field(description="A workspace's name (list_workspaces)")],
    scope: Annotated[Identity, Field(description="Your namespace for ids, e.g. 'agent-7'")],
    id: Annotated[Identity, Field(description="Your id for this command: the same (scope, id) is one execution")],
    argv: Annotated[list[str], Field(min_length=1, description=ARGV)],
    cwd: Annotated[str, Field(description="An absolute path, or empty for the default")] = "",
    env: Annotated[dict[str, str] | None, Field(description="Environment variables for it")] = None,
    pty: Annotated[
        bool,
        Field(
            description="True: on a terminal (colours, prompts; one stream). False: on pipes: stdout and stderr "
            "apart, stdin written with write_stdin and closed with eof (the program sees no terminal)"
        ),
    ] = True,
    timeout_seconds: Annotated[
        int | None,
        Field(
            ge=0,
            le=MAX_INTEGER,
            description="End it after this long; 0: no limit; none: the site's default "
            "(TETHER_SESSION_SECONDS, 12 h unless set)",
        ),
    ] = None,
    idle_seconds: Annotated[
        int | None,
        Field(
            ge=0,
            le=MAX_INTEGER,
            description="End it after this long without output or input; 0: no limit; none: "
            "the site's default (TETHER_IDLE_SECONDS, 30 min unless set): a quiet long build needs 0",
        ),
    ] = None,
    wait_seconds: Annotated[
        float, Field(ge=0, le=MAX_WAIT, description="Wait up to this long for its end before answering (0: at once)")
    ] = 0.0,
) -> Annotated[CallToolResult, CommandOutcome]:
    """Run a command on a machine, once: the same (scope, id) again returns the same execution and runs
    nothing. Answers at once, or after waiting up to wait_seconds, with its state, its exit when known, and
    its output's head and tail."""

    async def work(call):
        await db(need)(call, Scope.RUN)
        await db(need)(call, Scope.READ)  # what it answers is a read
        body = _input(api_executions.SubmitIn, scope=scope, id=id, machine=machine, argv=argv, env=env or {},
                      cwd=cwd, session_seconds=timeout_seconds, idle_seconds=idle_seconds, pty=pty)  # fmt: skip
        answer = _value(await db(api_executions.submit)(call, body))
        if ctx.request_context.experimental.is_task:  # a task answers at once: the execution is the task
            return await _outcome(call, answer["execution"]["id"], 0.0, answer["created"], with_output=False)
        return await _outcome(call, answer["execution"]["id"], wait_seconds, created=answer["created"])

    return await _serve(ctx, "run_command", work)


Reason = Annotated[str, Field(max_length=500, description="Why (kept in its history)")]
ExecutionNumber = Annotated[int, Field(ge=1, le=MAX_INTEGER, description="The execution's number (execution.id)")]


@server.tool(
    title="Wait for a command",
    annotations=ToolAnnotations(readOnlyHint=True, destructiveHint=False, idempotentHint=True, openWorldHint=False),
)
async def await_command(
    ctx: Context,
    execution: ExecutionNumber,
    timeout_seconds: Annotated[float, Field(ge=0, le=MAX_WAIT, description="Wait at most this long")] = 30.0,
) -> Annotated[CallToolResult, CommandOutcome]:
    """Wait (bounded) for a command's end. Says 'unknown' and that it awaits an operator when that is the
    truth: waiting longer will not change it."""

    async def work(call):
        return await _outcome(call, execution, timeout_seconds)

    return await _serve(ctx, "await_command", work)


@server.tool(
    name="read_output",
    title="Read output",
    annotations=ToolAnnotations(readOnlyHint=True, destructiveHint=False, idempotentHint=True, openWorldHint=False),
)
async def read_output_tool(
    ctx: Context,
    execution: ExecutionNumber,
    since: Annotated[
        int, Field(ge=0, le=MAX_INTEGER, description="The offset to read from (`next` of the last read)")
    ] = 0,
    size: Annotated[int, Field(ge=1, le=READ_BYTES, description="Bytes at most")] = READ_BYTES,
    wait_seconds: Annotated[float, Field(ge=0, le=MAX_WAIT, description="Wait up to this for output past since")] = 0.0,
    stream: Annotated[
        Literal["all", "stdout", "stderr"],
        Field(
            description="A command on pipes: stdout, stderr, or all (both in the order they came); `since` counts "
            "in it. A command on a terminal has only all"
        ),
    ] = "all",
) -> Annotated[CallToolResult, OutputOut]:
    """A command's output by byte offset: `next` is where to read on, `lost` bytes no longer kept (never a
    silent gap), `final` when no more will come."""

    async def work(call):
        read = await api_output.execution_output(call, execution, since, size, wait_seconds, stream)
        said = f"[offset {read['offset']}..{read['next']} of {read['end']}"
        said += f", {read['lost']} bytes lost before it" if read["lost"] else ""
        said += ", final]" if read["final"] else "]"
        return _result(f"{said}\n{read['text']}", OutputOut(**read))

    return await _serve(ctx, "read_output", work)


@server.tool(
    title="Write to a command's stdin",
    annotations=ToolAnnotations(readOnlyHint=False, destructiveHint=True, idempotentHint=True, openWorldHint=False),
)
async def write_stdin(
    ctx: Context,
    execution: ExecutionNumber,
    seq: Annotated[
        int, Field(ge=0, le=2**53, description="Your number for this input; a retry with the same seq is written once")
    ],
    data: Annotated[str | None, Field(description="Bytes for its stdin, as text")] = None,
    data_b64: Annotated[str | None, Field(description="... or as base64 (bytes that are not text)")] = None,
    eof: Annotated[bool, Field(description="Close its stdin after these bytes: the program reads its end")] = False,
    client: Annotated[
        str, Field(max_length=100, description="Which of your programs writes (numbers are per client, as the API's)")
    ] = "",
) -> Annotated[CallToolResult, InputOut]:
    """Write to the stdin of a command run with pty: false, at most once per seq (the next seq is one more than
    the last; the same seq again is not written again), and close it with eof."""

    async def work(call):
        body = _input(api_inputs.CommandInputIn, seq=seq, data=data, data_b64=data_b64, eof=eof, client=client)
        answer = InputOut(**await api_inputs.execution_input(call, execution, body))
        said = "written before (not again)" if answer.repeated else "written"
        return _result(f"stdin {seq}: {said}" + (", then closed" if eof else ""), answer)

    return await _serve(ctx, "write_stdin", work)


class Cancelled(BaseModel):
    ended: bool = Field(description="True: it had not started and is cancelled; False: its worker was asked to end it")
    detail: str
    execution: ExecutionOut


@server.tool(
    title="Cancel a command",
    annotations=ToolAnnotations(readOnlyHint=False, destructiveHint=True, idempotentHint=True, openWorldHint=False),
)
async def cancel_command(
    ctx: Context,
    execution: ExecutionNumber,
    reason: Reason = "",
) -> Annotated[CallToolResult, Cancelled]:
    """Cancel a command. Not started: cancelled at once. Running: its worker ends its process tree; it ends
    'completed' (killed) only when the tree is proven gone, else 'unknown'. await_command tells which."""

    async def work(call):
        answer = await db(api_executions.cancel)(call, execution, _input(api_executions.CancelIn, reason=reason))
        ended = answer.status_code == 200
        detail = "cancelled before it started" if ended else "its worker was asked to end it: await_command"
        cancelled = Cancelled(ended=ended, detail=detail, execution=answer.value)
        return _result(f"execution {execution}: {detail}", cancelled)

    return await _serve(ctx, "cancel_command", work)
