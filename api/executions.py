"""Machines and executions: submit (idempotent by scope, id and spec), get, list, await, output by cursor,
cancel and resolve. Every check is the command line's: the same actions, the same refusals."""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import re
import time
from collections import OrderedDict
from typing import Annotated, Literal

from channels.db import database_sync_to_async as db
from django.conf import settings
from django.db import transaction
from django.db.models import OuterRef, Prefetch, Q, Subquery
from django.http import HttpResponse, StreamingHttpResponse
from ninja import Field, Query, Router, Schema, Status
from pydantic import StringConstraints

from access.fence import decided_again
from access.policy import Do, machine_named, may, reach_of
from api.auth import need, usable
from api.inputs import InputOut, deliver, written_before
from api.models import ApiToken, Scope
from api.owner_calls import NotSent, ask
from api.problems import ApiProblem, answers, field_error
from api.schemas import ABSOLUTE_PATH, ENV_NAME, MACHINE_NAME, NO_NUL, Body, Text
from executions import actions as exec_actions
from executions import pipes
from executions.actions import Actor
from executions.actions.common import IDENTITY
from executions.errors import TransitionRefused
from executions.models import ENDED_STATES, FINAL_STATES, Evidence, Execution, ExecutionAlias, ExecutionEvent, State
from executions.presenters import execution_json
from executions.spec import MAX_ARGV_BYTES, MAX_COLS, MAX_ROWS, ExecutionSpec, SpecError
from terminals.actions import request_process_action
from terminals.owner_client import owner_of_execution
from terminals.protocol import MAX_INTEGER, Peek
from terminals.resolution import resolve

log = logging.getLogger(__name__)
router = Router(tags=["executions"])

READ_BYTES = 64 * 1024  # the most one output read returns (ask again from ``next``)
MAX_INPUT_BYTES = 64 * 1024  # the most one input call writes to a command's stdin
STREAMS = (
    "A command on pipes (`pty: false`): `stdout`, `stderr`, or `all` (both, in the order they came); `since` "
    "and the answer's offsets count in that stream. A command on a terminal has only `all`"
)
RESOLVE_PERMISSION = "executions.resolve_execution"


def actor_of(token) -> Actor:
    return Actor(token.label, token.user)


# --- machines --------------------------------------------------------------------------------------


class MachineOut(Schema):
    name: str
    backend: str
    state: str
    scope: str
    role: str = Field(description="Your role on it: watch, use or operate (docs/access.md)")
    labels: dict[str, str]
    busy: bool = Field(description="Its command slot is held (a command or a terminal runs there)")


@router.get("/machines", **answers(list[MachineOut]), tags=["machines"], summary="Machines you may reach")
def machines(request):
    token = need(request, Scope.READ)
    reach = reach_of(token)
    return [
        {"name": m.name, "backend": m.backend, "state": m.state, "scope": m.scope, "role": reach.role(m),
         "labels": m.labels or {}, "busy": bool(m.active_execution_id)}
        for m in reach.machines(Do.SEE)
    ]  # fmt: skip


# --- executions ------------------------------------------------------------------------------------


class AliasOut(Schema):
    scope: str
    id: str


class ExecutionOut(Schema):
    id: int = Field(description="Tether's number for it: the address of every call about it")
    scope: str
    execution_id: str
    aliases: list[AliasOut] = Field(description="Your other (scope, id) pairs that name it too")
    kind: str
    machine: str
    pty: bool = Field(description="On a terminal (true), or on pipes (false: stdout and stderr apart)")
    state: str = Field(description="pending, dispatched, running, completed, cancelled, unknown or resolved")
    evidence: str
    exit_code: int | None
    exit_signal: int | None
    outcome: str = Field(description="How it ended, in words; 'unknown' is never made into an exit")
    why: str = Field(
        "",
        description="Once it ended other than by its own exit: why, as recorded (why it did not start, what was lost)",
    )
    close_reason: str
    spec: dict
    spec_digest: str
    created_at: str | None
    dispatched_at: str | None
    started_at: str | None
    ended_at: str | None
    resolved_at: str | None
    resolution_note: str
    resolved_by: str | None


def execution_out(execution: Execution) -> dict:
    data = execution_json(execution)
    for said_apart in ("output", "output_truncated", "stdout", "stderr"):  # read by offset instead
        data.pop(said_apart, None)
    return {"id": execution.pk, **data, "pty": execution.spec.get("pty", True), "why": why_of(execution)}


OWN_ENDS = frozenset({Evidence.EXITED, Evidence.EXIT_STATUS, Evidence.SIGNALED})  # the program's own end says it


def _why(executions):
    """Each ended execution's reason, as the event that moved it to its state recorded it (one query for all)."""
    ended = ExecutionEvent.objects.filter(execution=OuterRef("pk"), to_state=OuterRef("state")).order_by("-at", "-id")
    return executions.annotate(why=Subquery(ended.values("reason")[:1]))


def why_of(execution: Execution) -> str:
    if execution.state not in ENDED_STATES or execution.evidence in OWN_ENDS:
        return ""
    if not hasattr(execution, "why"):
        execution.why = _why(Execution.objects.filter(pk=execution.pk)).values_list("why", flat=True).first()
    return execution.why or ""


def said_of(execution: Execution) -> tuple[str, str]:
    """What it awaits, and the detail said with it: how it ended (and why, when not by its own exit)."""
    if execution.state in FINAL_STATES:
        why = why_of(execution)
        return "nothing", f"{execution.outcome_label}: {why}" if why else execution.outcome_label
    return AWAITING[execution.state]


def namespace_of(token) -> str:
    """Where the (scope, id) a token's user submits live: theirs alone."""
    return f"user:{token.user_id}"


def visible(token):
    """The executions a token may see: its user's own commands and shells, on machines it still reaches. Staff
    permissions widen the machines, never whose work: another user's output is theirs (docs/access.md)."""
    user = token.user
    reached = [machine.pk for machine in reach_of(token).machines(Do.SEE)]
    yours = Prefetch("aliases", queryset=ExecutionAlias.objects.filter(namespace=namespace_of(token)))  # never others'
    executions = _why(Execution.objects.select_related("machine", "resolved_by").prefetch_related(yours))
    return executions.filter(Q(requested_by=user) | Q(terminal_session__user=user), machine__in=reached)


def still(request) -> None:
    """Between the turns of a long poll: the token may have been revoked or its user's access taken away
    meanwhile; then the poll ends at once with that answer (and delivers nothing printed after)."""
    token = ApiToken.objects.select_related("user").get(pk=request.auth.pk)
    if (problem := usable(token)) is not None:
        raise problem
    request.auth = token


def _mine(request, pk: int) -> Execution:
    execution = visible(request.auth).filter(pk=pk).first()
    if execution is None:
        raise ApiProblem("not_found", f"no execution {pk} of yours")
    return execution


EnvName = Annotated[str, StringConstraints(min_length=1, max_length=4096, pattern=ENV_NAME)]
Identity = Annotated[str, StringConstraints(max_length=200, pattern=IDENTITY.pattern)]
MAX_ALIASES = 20  # given in one call
MAX_WAIT = 3600  # a bound on what is asked; how long a call waits at most is TETHER_API_MAX_WAIT_SECONDS
WAITS = "Seconds to wait: up to 3600 may be asked; a call waits at most TETHER_API_MAX_WAIT_SECONDS (60 by default)"


class AliasIn(Body):
    scope: Identity
    id: Identity


class SubmitIn(Body):
    scope: str = Field(
        max_length=200, pattern=IDENTITY.pattern, description="Your namespace for ids, e.g. 'ci' or 'agent-7'"
    )
    id: str = Field(
        max_length=200,
        pattern=IDENTITY.pattern,
        description="Your id for it: the same (scope, id, spec) is one execution",
    )
    machine: str = Field(max_length=100, pattern=MACHINE_NAME)
    argv: list[Text] = Field(min_length=1, max_length=4096, description=f"At most {MAX_ARGV_BYTES} bytes in all")
    env: dict[EnvName, Text] = Field(
        default_factory=dict,
        max_length=1024,
        description="Names without '='",
        json_schema_extra={"additionalProperties": False},  # a name must match the pattern of names
    )
    cwd: str = Field("", max_length=4096, pattern=ABSOLUTE_PATH, description="An absolute path, or empty")
    cols: int | None = Field(None, ge=1, le=MAX_COLS)
    rows: int | None = Field(None, ge=1, le=MAX_ROWS)
    session_seconds: int | None = Field(None, ge=0, le=MAX_INTEGER, description="0: no limit")
    idle_seconds: int | None = Field(None, ge=0, le=MAX_INTEGER, description="0: no limit")
    output_limit_bytes: int | None = Field(None, ge=0, le=MAX_INTEGER, description="0: no limit")
    pty: bool = Field(
        True,
        description="False: on pipes, not a terminal: stdout and stderr apart (read with `stream`), stdin written "
        "with `/input` and closed with `eof`; the program has no terminal (isatty is false)",
    )
    aliases: list[AliasIn] = Field(
        default_factory=list,
        max_length=MAX_ALIASES,
        description="Other (scope, id) pairs of yours that name it too (added on a re-submission as well); "
        "one that already names another execution refuses the whole submission (identity_conflict)",
    )


class SubmitOut(Schema):
    created: bool = Field(description="False: this (scope, id, spec) was submitted before; nothing runs again")
    execution: ExecutionOut


@router.post(
    "/executions",
    **answers({200: SubmitOut, 201: SubmitOut}, "not_found", "identity_conflict", "slot_taken", "state_conflict"),
    summary="Submit a command (idempotent)",
)
def submit(request, body: SubmitIn):
    token = need(request, Scope.RUN)
    try:
        spec = ExecutionSpec.build(
            body.argv,
            env=body.env,
            cwd=body.cwd,
            cols=body.cols,
            rows=body.rows,
            session_seconds=body.session_seconds,
            idle_seconds=body.idle_seconds,
            output_limit_bytes=body.output_limit_bytes,
            pty=body.pty,
        )
    except SpecError as error:
        raise ApiProblem("validation_error", str(error), errors=[field_error(str(error))]) from None
    namespace = namespace_of(token)
    existing = exec_actions.find_execution(body.scope, body.id, namespace)
    if existing is not None:
        if not may(token, Do.SEE, existing.machine):  # the same id, on a machine this token does not reach
            raise ApiProblem("identity_conflict", f"{body.scope}/{body.id} was submitted before, elsewhere")
        if existing.spec_digest != spec.digest or existing.machine.name != body.machine:
            raise ApiProblem(
                "identity_conflict",
                f"{body.scope}/{body.id} was submitted with a different spec or machine",
                existing_digest=existing.spec_digest,
                submitted_digest=spec.digest,
                existing_machine=existing.machine.name,
                execution=existing.pk,
            )
    machine = machine_named(token, body.machine, Do.USE)  # the same work for a name nothing carries
    if machine is None:
        raise ApiProblem("not_found", f"no machine {body.machine!r} you may use")
    with transaction.atomic():
        # Decided again behind the fence: a revoke (of the grant, the token, the person) that committed meanwhile
        # refuses it; one after it ends the token's reads and sockets, the command runs on (access/fence.py).
        if not decided_again(token, Do.USE, machine):
            raise ApiProblem("not_found", f"no machine {body.machine!r} you may use")
        exec_actions.claiming(namespace, [(body.scope, body.id), *((a.scope, a.id) for a in body.aliases)])
        execution, created = exec_actions.submit_execution(
            scope=body.scope, execution_id=body.id, machine_name=machine.name, spec=spec, actor=actor_of(token),
            namespace=namespace,
        )  # fmt: skip
        for alias in body.aliases:  # one refused: nothing of this submission stands
            exec_actions.add_alias(execution, alias.scope, alias.id, namespace=namespace, actor=actor_of(token))
    execution = visible(token).get(pk=execution.pk)  # its aliases as this person gave them
    return Status(201 if created else 200, {"created": created, "execution": execution_out(execution)})


@router.get("/executions", **answers(list[ExecutionOut]), summary="Executions in a scope, newest first")
def list_executions(
    request, scope: str = Query(..., max_length=200, pattern=IDENTITY.pattern), limit: int = Query(50, ge=1, le=500)
):
    """Those named in ``scope`` by their own id or by one of your aliases, each once."""
    token = need(request, Scope.READ)
    aliased = Q(aliases__namespace=namespace_of(token), aliases__scope=scope)
    return [execution_out(e) for e in visible(token).filter(Q(scope=scope) | aliased).distinct()[:limit]]


@router.get("/executions/lookup", **answers(ExecutionOut, "not_found"), summary="An execution by your (scope, id)")
def lookup(
    request,
    scope: str = Query(..., max_length=200, pattern=IDENTITY.pattern),
    id: str = Query(..., max_length=200, pattern=IDENTITY.pattern),
):
    token = need(request, Scope.READ)
    execution = exec_actions.find_execution(scope, id, namespace_of(token))
    if execution is None or not visible(token).filter(pk=execution.pk).exists():
        raise ApiProblem("not_found", f"no execution {scope}/{id} of yours")
    return execution_out(execution)


@router.post(
    "/executions/{pk}/aliases",
    **answers({200: ExecutionOut, 201: ExecutionOut}, "not_found", "identity_conflict"),
    summary="Name an execution by another (scope, id) of yours",
)
def add_alias(request, pk: int, body: AliasIn):
    """Another producer's id for the same execution: a lookup or a submission under it then finds this one,
    and a listing of its scope shows it once. 201 when added, 200 when it named this execution already."""
    token = need(request, Scope.RUN)
    execution = _mine(request, pk)
    _, created = exec_actions.add_alias(
        execution, body.scope, body.id, namespace=namespace_of(token), actor=actor_of(token)
    )
    return Status(201 if created else 200, execution_out(_mine(request, pk)))


@router.get("/executions/{pk}", **answers(ExecutionOut, "not_found"), summary="One execution")
def get_execution(request, pk: int):
    need(request, Scope.READ)
    return execution_out(_mine(request, pk))


class AwaitOut(Schema):
    final: bool = Field(description="completed, cancelled or resolved: the record will not change again")
    awaiting: str = Field(description="nothing (final), start, program (it runs) or operator (unknown outcome)")
    detail: str
    execution: ExecutionOut


AWAITING = {
    State.PENDING: ("start", "it waits for a worker to start it"),
    State.DISPATCHED: ("start", "a worker is starting it"),
    State.RUNNING: ("program", "it is still running"),
    State.UNKNOWN: (
        "operator",
        "its outcome is unknown until an operator resolves it (the process may still be running); "
        "an await cannot end this by itself",
    ),
}


@router.get("/executions/{pk}/await", **answers(AwaitOut, "not_found"), summary="Wait (long poll) for a final state")
async def await_execution(request, pk: int, timeout: float = Query(30.0, ge=0, le=MAX_WAIT, description=WAITS)):
    await db(need)(request, Scope.READ)
    deadline = time.monotonic() + min(timeout, settings.TETHER_API_MAX_WAIT_SECONDS)
    while True:
        await db(still)(request)
        execution = await db(_mine)(request, pk)
        if execution.state in FINAL_STATES:
            awaiting, detail = said_of(execution)
            return {"final": True, "awaiting": awaiting, "detail": detail, "execution": execution_out(execution)}
        if time.monotonic() >= deadline:
            awaiting, detail = AWAITING[execution.state]
            return {"final": False, "awaiting": awaiting, "detail": detail, "execution": execution_out(execution)}
        await asyncio.sleep(0.2)


class ChunkOut(Schema):
    stream: str = Field(description="stdout or stderr")
    offset: int = Field(description="Where it starts in its own stream")
    seq: int = Field(description="Where it starts in both streams in the order they came (`stream=all` offsets)")
    data: str = Field(description="base64")
    text: str = Field(description="The same bytes as UTF-8 (invalid or split sequences replaced)")


class OutputOut(Schema):
    data: str = Field(description="The bytes from `offset`, base64")
    text: str = Field(description="The same bytes as UTF-8 (invalid or split sequences replaced)")
    offset: int = Field(description="Where `data` starts: `since`, or `first_kept` when bytes were lost")
    next: int = Field(description="Where to read next (`since` of the next call)")
    first_kept: int = Field(description="The first offset still kept")
    lost: int = Field(description="Bytes after `since` no longer kept (never a silent gap)")
    truncated_head: bool = Field(description="Bytes before `first_kept` are gone")
    end: int = Field(description="Where the output known so far ends")
    final: bool = Field(description="No more output will come (the record is settled and read to its end)")
    source: str = Field(description="live (from the worker holding it) or record (from the settled record)")
    state: str
    complete: bool = Field(
        True,
        description="False: a worker was lost while the command ran, and what it printed while no worker saw "
        "it is not in the record (how much is not known); the output up to `end` is what was seen",
    )
    restarted: bool = Field(
        False,
        description="The stream started again (a new shell, or an adoption that "
        "cannot keep offsets): read from `offset` with the new `generation` and `epoch`",
    )
    generation: int = 0
    epoch: int = 0
    offsets_survive_owner: bool = Field(
        True, description="Offsets stay the same when another worker takes the process over (a held shell)"
    )
    cols: int | None = Field(None, description="The grid its program draws for now (live reads): columns")
    rows: int | None = Field(None, description="... and rows")
    stream: str = Field(
        "all",
        description="What was read: `all` (a terminal's one stream, or both pipes in the order they came), "
        "`stdout` or `stderr`; offsets count in it",
    )
    chunks: list[ChunkOut] | None = Field(
        None, description="A command on pipes: `data` in pieces, each saying its stream and where it stands"
    )


def past_the_end(since: int, end: int, **where) -> ApiProblem:
    """An offset no output has reached: said, with where the output ends, never answered as an end of its own."""
    text = f"since={since} is past the end of the output ({end}); read from an offset you were given"
    return ApiProblem("offset_out_of_range", text, end=end, **where)


def view_of(execution: Execution, stream: str) -> pipes.View | None:
    """The view a read of ``stream`` takes of the execution's output: None for a terminal's one stream."""
    if execution.spec.get("pty", True):
        if stream != pipes.View.ALL:
            raise ApiProblem("wrong_kind", f"a command on a terminal has one stream: read stream=all, not {stream}")
        return None
    return pipes.View(stream)


def shaped_view(read: pipes.ViewRead, view: pipes.View, **rest) -> dict:
    chunks = [
        {"stream": c.stream.value, "offset": c.offset, "seq": c.seq, "data": base64.b64encode(c.data).decode(),
         "text": c.data.decode("utf-8", "replace")}
        for c in read.chunks
    ]  # fmt: skip
    answer = shaped(read.data, read.offset, read.next, read.first_kept, read.lost, read.end, **rest)
    return {**answer, "stream": view.value, "chunks": chunks}


_RECORD_PIECES: OrderedDict[tuple[int, int, int], list[pipes.Piece]] = OrderedDict()  # the last records read


def _record_pieces(execution: Execution) -> list[pipes.Piece]:
    """A settled record's pieces, parsed once for the reads that follow (a reader goes through it in steps)."""
    output, origin = execution.output or b"", execution.output_truncated
    key = (execution.pk, origin, len(output))
    if (found := _RECORD_PIECES.get(key)) is None:
        found = _RECORD_PIECES[key] = pipes.pieces(bytes(output), origin)
        while len(_RECORD_PIECES) > 8:
            _RECORD_PIECES.popitem(last=False)
    return found


def view_from_record(execution: Execution, view: pipes.View, since: int, size: int) -> dict:
    origin = execution.output_truncated
    found = _record_pieces(execution)
    first, end = pipes.first_and_end(found, view, whole=origin == 0) or (since, since)
    if since > end:
        raise past_the_end(since, end)
    read = pipes.read(found, view, since, size, first, end)
    complete = execution.output_complete or execution.started_at is None
    return shaped_view(read, view, final=read.next >= end, source="record", state=execution.state, complete=complete)


def view_from_owner(answer: dict, view: pipes.View, since: int, size: int, state: str) -> dict | None:
    """A live read of a view, or None while the owner has not read that far again (after an adoption)."""
    found = pipes.pieces(answer["data"], answer["offset"])
    first, end = (answer["view_first"], answer["view_end"]) if answer["view_end"] >= 0 else (since, since)
    where = {"generation": answer["generation"], "epoch": answer["epoch"], "offsets_survive_owner": answer["survives"]}
    if since > end:
        if answer.get("written", 0) <= answer["end"]:  # nothing more is coming back from before: made up
            raise past_the_end(since, end, **where)
        return None
    read = pipes.read(found, view, since, size, first, end)
    return shaped_view(read, view, final=False, source="live", state=state, **where)


def output_from_record(execution: Execution, since: int, size: int, view: pipes.View | None = None) -> dict:
    if view is not None:
        return view_from_record(execution, view, since, size)
    output = bytes(execution.output or b"")
    first = execution.output_truncated
    end = first + len(output)
    if since > end:
        raise past_the_end(since, end)
    start = max(since, first)
    data = output[start - first : start - first + size]
    after = start + len(data) if start < end else since
    # Nothing printed is missing from a record its owner saw to the end, or of a command that never started.
    complete = execution.output_complete or execution.started_at is None
    return shaped(data, start if start < end else after, after, first, max(first - since, 0), end,
                  final=after >= end, source="record", state=execution.state, complete=complete)  # fmt: skip


def shaped(data: bytes, offset: int, after: int, first: int, lost: int, end: int, **rest) -> dict:
    return {
        "data": base64.b64encode(data).decode(),
        "text": data.decode("utf-8", "replace"),
        "offset": offset,
        "next": after,
        "first_kept": first,
        "lost": lost,
        "truncated_head": first > 0,
        "end": end,
        **rest,
    }


def output_from_owner(answer: dict, since: int, state: str) -> dict:
    data = answer["data"]
    offset = answer["offset"]
    return shaped(data, offset, offset + len(data), answer["start"], answer["lost"], answer["end"], final=False,
                  source="live", state=state, generation=answer["generation"], epoch=answer["epoch"],
                  offsets_survive_owner=answer["survives"],
                  cols=answer.get("cols"), rows=answer.get("rows"))  # fmt: skip


async def read_output(load, since: int, size: int, wait: float, viewer: str, view: pipes.View | None = None) -> dict:
    """Output from ``since`` of the execution ``load()`` reads: from the worker holding the process while it
    runs, from the settled record after. ``wait``: how long to wait for output past ``since`` (or for an
    owner, between owners) before answering with none. ``load`` raises when the caller may no longer read it
    (a revoked token, access taken away): asked at every turn, and once more before output is delivered."""
    deadline = time.monotonic() + wait
    while True:
        execution = await db(load)()
        if execution.state in ENDED_STATES:
            return output_from_record(execution, since, size, view)
        owner = await db(owner_of_execution)(execution.pk)
        asked = {"view": view.value} if view is not None else {}
        try:
            answer = await ask(owner, Peek, viewer=viewer, since=since, size=size, **asked) if owner else None
        except NotSent as error:  # the channel layer (Redis) away: as good as no answer
            log.warning("could not ask the owner of execution %s: %r", execution.pk, error)
            answer = None
        if answer is not None and answer.get("type") == "api.output" and view is not None:
            result = view_from_owner(answer, view, since, size, execution.state)
            if result is not None and (result["data"] or result["lost"] or time.monotonic() >= deadline):
                await db(load)()  # access taken away while the worker answered: none of it is delivered
                return result
            if result is None and time.monotonic() >= deadline:
                return shaped_view(pipes.read([], view, since, 0, since, since), view, final=False, source="live",
                                   state=execution.state)  # fmt: skip
        elif answer is not None and answer.get("type") == "api.output":
            coming = since <= answer.get("written", 0)  # read before, by an owner that died: its holder resends it
            if since > answer["end"] and not coming:
                where = {"generation": answer["generation"], "epoch": answer["epoch"]}
                raise past_the_end(since, answer["end"], **where, offsets_survive_owner=answer["survives"])
            if since > answer["end"]:  # the new owner has not read that far again yet: nothing new, for now
                if time.monotonic() >= deadline:
                    return shaped(b"", since, since, answer["start"], 0, answer["written"], final=False, source="live",
                                  state=execution.state, generation=answer["generation"], epoch=answer["epoch"],
                                  offsets_survive_owner=answer["survives"])  # fmt: skip
                await asyncio.sleep(0.1)
                continue
            result = output_from_owner(answer, since, execution.state)
            if result["data"] or result["lost"] or time.monotonic() >= deadline:
                await db(load)()  # access taken away while the worker answered: none of it is delivered
                return result
        elif time.monotonic() >= deadline:
            if execution.state in (State.PENDING, State.DISPATCHED):  # not started yet: nothing printed
                if view is not None:
                    return shaped_view(pipes.read([], view, since, 0, 0, since), view, final=False, source="live",
                                       state=execution.state)  # fmt: skip
                return shaped(b"", since, since, 0, 0, since, final=False, source="live", state=execution.state)
            raise ApiProblem(
                "owner_unavailable",
                "no worker answers for this process right now (it may be changing hands); "
                "read again from the same offset",
                retry_after=1,
            )
        await asyncio.sleep(0.1)


@router.get(
    "/executions/{pk}/output",
    **answers(OutputOut, "not_found", "offset_out_of_range", "owner_unavailable", "wrong_kind"),
    summary="Output by byte offset (resumable)",
)
async def execution_output(
    request,
    pk: int,
    since: int = Query(0, ge=0, le=MAX_INTEGER),
    size: int = Query(READ_BYTES, ge=1, le=READ_BYTES),
    wait: float = Query(0.0, ge=0, le=MAX_WAIT, description=WAITS),
    stream: Literal["all", "stdout", "stderr"] = Query("all", description=STREAMS),
):
    token = await db(need)(request, Scope.READ)
    view = view_of(await db(_mine)(request, pk), stream)
    wait = min(wait, settings.TETHER_API_MAX_WAIT_SECONDS)
    return await read_output(lambda: _still_mine(request, pk), since, size, wait, f"api:{token.pk}", view)


def _still_mine(request, pk: int) -> Execution:
    still(request)
    return _mine(request, pk)


# --- output as Server-Sent Events ----------------------------------------------------------------------------

PING_SECONDS = 15  # a comment at least this often: proxies (HAProxy's `timeout server`) see a live stream
TURN_SECONDS = 2  # each read waits at most this for news: a lost worker is said (`waiting`) this soon
EVENT_STREAM = {
    "description": (
        "`text/event-stream`: `output` events (`id` = the offset to resume from; `data` = the JSON of an output "
        "read: `data` base64, `text`, `offset`, `next`, `lost`, `first_kept`, `end`), `waiting` while no worker "
        "holds the process, one `end` (the record, and what it awaits) or `error` (a problem), then the stream "
        "closes. Resume with `Last-Event-ID`."
    ),
    # Each event, as Open API 3.1 describes an event stream's items: its type, its id (an offset), its JSON.
    "content": {
        "text/event-stream": {
            "schema": {
                "type": "object",
                "properties": {
                    "event": {"type": "string", "enum": ["output", "waiting", "end", "error"]},
                    "id": {"type": "string", "pattern": "^[0-9]+$"},
                    "data": {"type": "string", "contentMediaType": "application/json"},
                },
                "required": ["event", "data"],
            }
        }
    },
}


RESUMED_AT_THE_END = {
    "description": "A reconnect (`Last-Event-ID`) at the end of output that is over: nothing more will come (an "
    "`EventSource` stops reconnecting); ask `await` for the record"
}


def _event(kind: str, data: dict, event_id: int | None = None) -> str:
    said = f"id: {event_id}\n" if event_id is not None else ""
    return f"{said}event: {kind}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


def _resume_from(request, since: int) -> int:
    """``Last-Event-ID`` (an EventSource's reconnect: the offset it read to) over ``since``."""
    said = request.headers.get("Last-Event-ID")
    if said is None or not said.strip():
        return since
    if not re.fullmatch(r"[0-9]{1,20}", said.strip()) or int(said) > MAX_INTEGER:
        raise ApiProblem("invalid_request", "Last-Event-ID must be a byte offset this stream gave (a whole number)")
    return int(said)


@router.get(
    "/executions/{pk}/output/stream",
    **answers(None, "not_found", "offset_out_of_range", "wrong_kind", raw={200: EVENT_STREAM, 204: RESUMED_AT_THE_END}),
    summary="Output as Server-Sent Events (resumable by Last-Event-ID)",
)
async def execution_output_stream(
    request,
    pk: int,
    since: int = Query(0, ge=0, le=MAX_INTEGER, description="Where to start; a Last-Event-ID header wins"),
    timeout: float = Query(
        600, ge=1, le=MAX_WAIT, description="Seconds to keep the stream open, at most TETHER_API_STREAM_SECONDS"
    ),
    stream: Literal["all", "stdout", "stderr"] = Query("all", description=STREAMS),
):
    """The output from ``since`` as it comes, then its end: the long poll's answers, pushed. Across a worker's
    loss it says `waiting` and goes on from the same offset; bytes no longer kept are said (`lost`)."""
    token = await db(need)(request, Scope.READ)
    view = view_of(await db(_mine)(request, pk), stream)
    since = _resume_from(request, since)
    viewer = f"api:{token.pk}"

    def load():
        return _still_mine(request, pk)

    try:  # an offset past the end is refused as a status, before the stream starts
        first = await read_output(load, since, READ_BYTES, 0.0, viewer, view)
    except ApiProblem as problem:
        if problem.code != "owner_unavailable":
            raise
        first = None
    if request.headers.get("Last-Event-ID") and first and first["final"] and not (first["data"] or first["lost"]):
        ended = HttpResponse(status=204)  # the reconnect of a stream that had ended: its end was sent before
        del ended["Content-Type"]  # no body, no type
        return ended
    deadline = time.monotonic() + min(timeout, settings.TETHER_API_STREAM_SECONDS)
    response = StreamingHttpResponse(
        _output_events(load, since, first, deadline, viewer, view), content_type="text/event-stream"
    )
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # nginx: pass each event on as it comes
    return response


async def _output_events(load, since: int, answer: dict | None, deadline: float, viewer: str, view=None):
    yield "retry: 1000\n\n"
    waiting, quiet_since = False, time.monotonic()
    while True:
        if answer is not None:
            waiting = False
            if answer["data"] or answer["lost"]:
                yield _event("output", answer, event_id=answer["next"])
                quiet_since = time.monotonic()
            since = answer["next"]
            if answer["final"]:
                try:
                    execution = await db(load)()
                except ApiProblem as problem:
                    yield _event("error", {"code": problem.code, "detail": problem.detail})
                    return
                awaiting, detail = said_of(execution)
                said = {"awaiting": awaiting, "detail": detail, "complete": answer.get("complete", True)}
                yield _event("end", {**said, "execution": execution_out(execution)}, event_id=since)
                return
        left = deadline - time.monotonic()
        if left <= 0:
            yield ": the stream's time is up: reconnect with Last-Event-ID to go on\n\n"
            return
        if time.monotonic() - quiet_since >= PING_SECONDS:
            yield ": still running\n\n"
            quiet_since = time.monotonic()
        try:
            answer = await read_output(load, since, READ_BYTES, min(TURN_SECONDS, left), viewer, view)
        except ApiProblem as problem:
            if problem.code != "owner_unavailable":
                yield _event("error", {"code": problem.code, "detail": problem.detail})
                return
            answer = None
            if not waiting:
                yield _event("waiting", {"detail": problem.detail, "since": since})
                waiting, quiet_since = True, time.monotonic()


class CommandInputIn(Body):
    seq: int = Field(..., ge=0, le=2**53, description="Your number for this input: a retry of it is written once")
    data: str | None = Field(None, max_length=MAX_INPUT_BYTES, description="Bytes for its stdin, as text (UTF-8)")
    data_b64: str | None = Field(
        None,
        max_length=(MAX_INPUT_BYTES + 2) // 3 * 4,
        pattern=r"^[A-Za-z0-9+/]*={0,2}$",
        description="Bytes for its stdin as base64",
    )
    eof: bool = Field(False, description="Close its stdin after these bytes (the program reads its end)")
    client: str = Field(
        "", max_length=100, pattern=NO_NUL, description="Which of your programs sends it (numbers are per client)"
    )


@router.post(
    "/executions/{pk}/input",
    **answers(
        InputOut,
        "not_found",
        "forbidden",
        "wrong_kind",
        "state_conflict",
        "input_unconfirmed",
        "input_gap",
        "input_conflict",
        "too_large",
        "owner_unavailable",
    ),
    summary="Write to a command's stdin, or close it (pty: false; numbered, written once)",
)
async def execution_input(request, pk: int, body: CommandInputIn):
    """For a command on pipes: bytes for its stdin, and with `eof` its end. Each `seq` is written at most once
    however often it is sent (the same contract as a terminal's input)."""
    token = await db(need)(request, Scope.RUN)
    execution = await db(_mine)(request, pk)
    if not await db(may)(token, Do.OPERATE, execution):
        raise ApiProblem("forbidden", f"you may not write to execution {pk}")
    if execution.spec.get("pty", True):
        raise ApiProblem(
            "wrong_kind", "this command runs on a terminal: it has no stdin of its own (submit it with pty: false)"
        )
    if body.data is not None and body.data_b64 is not None:
        raise ApiProblem("validation_error", "send the bytes as at most one of data or data_b64")
    try:
        data = body.data.encode() if body.data is not None else base64.b64decode(body.data_b64 or "", validate=True)
    except (binascii.Error, ValueError):
        raise ApiProblem("validation_error", "data_b64 is not base64") from None
    if len(data) > MAX_INPUT_BYTES:
        raise ApiProblem("too_large", f"at most {MAX_INPUT_BYTES} bytes of input a call", limit=MAX_INPUT_BYTES)
    if not data and not body.eof:
        raise ApiProblem("validation_error", "send some bytes, or eof: true to close its stdin")
    encoded = pipes.encode_input(data, close=body.eof)
    target = {"execution": execution}
    if await db(written_before)(token, target, body.seq, body.client, encoded):  # a retry: so said, whenever
        return {"written": True, "repeated": True, "seq": body.seq}
    if execution.state in ENDED_STATES:
        raise ApiProblem("state_conflict", f"the command is {execution.state}: it takes no input now")
    if execution.state != State.RUNNING:
        raise ApiProblem("owner_unavailable", "it has not started yet; send the same seq again", retry_after=1)
    owner = await db(owner_of_execution)(execution.pk)
    return await deliver(token, target, owner, body.seq, body.client, encoded, "the command", closes=body.eof)


class CancelIn(Body):
    reason: str = Field("", max_length=500, pattern=NO_NUL)


@router.post(
    "/executions/{pk}/cancel",
    **answers({200: ExecutionOut, 202: ExecutionOut}, "not_found", "forbidden", "state_conflict"),
    summary="Cancel",
)
def cancel(request, pk: int, body: CancelIn):
    """Pending: cancelled at once (200), nothing ran. Dispatched or running: its owner is asked to end the
    process tree (202); it ends completed (killed) only when the tree is proven gone, else unknown."""
    token = need(request, Scope.RUN)
    execution = _mine(request, pk)
    if not may(token, Do.OPERATE, execution):  # seen, but ending it is not this token's to do
        raise ApiProblem("forbidden", f"you may not cancel execution {pk}")
    actor = actor_of(token)
    if execution.state == State.PENDING:
        try:
            return Status(200, execution_out(exec_actions.cancel_execution(execution, actor=actor, reason=body.reason)))
        except TransitionRefused:
            execution.refresh_from_db()  # a worker dispatched it meanwhile: cancel through its owner
    if execution.state in (State.DISPATCHED, State.RUNNING):
        request_process_action(execution, "cancel", actor=actor, reason=body.reason)
        return Status(202, execution_out(execution))
    raise TransitionRefused(str(execution), execution.state, "cancelled")


class ResolveIn(Body):
    note: str = Field(
        ..., min_length=1, max_length=4000, pattern=NO_NUL, description="What you saw that shows the process is gone"
    )


@router.post(
    "/executions/{pk}/resolve",
    **answers(ExecutionOut, "not_found", "forbidden", "resolve_refused", "state_conflict"),
    summary="Resolve an unknown outcome (operators)",
)
def resolve_execution(request, pk: int, body: ResolveIn):
    """The same checks as `exec_resolve` (owner, machine, process, note); the outcome stays unknown."""
    token = need(request, Scope.RUN)
    user = token.user
    if not (user.is_staff and user.has_perm(RESOLVE_PERMISSION)):
        raise ApiProblem("forbidden", f"resolving needs an active staff user with {RESOLVE_PERMISSION}")
    execution = Execution.objects.select_related("machine").filter(pk=pk).first()
    if execution is None or not may(token, Do.RESOLVE, execution):  # a machine this token does not reach
        raise ApiProblem("not_found", f"no execution {pk}")
    if not body.note.strip():
        raise ApiProblem("validation_error", "say what evidence shows the process is gone")
    resolved, _ = resolve(execution, actor=actor_of(token), note=body.note, via="api")
    return execution_out(resolved)
