"""An execution's output: by byte offset (resumable, a long poll) and pushed as Server-Sent Events, from the
worker holding its process while it runs and from the record once settled; a command on pipes read by stream
(executions.pipes)."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import re
import time
from collections import OrderedDict
from typing import Literal

from channels.db import database_sync_to_async as db
from django.conf import settings
from django.http import HttpResponse, StreamingHttpResponse
from ninja import Field, Query, Router, Schema

from api.auth import need
from api.models import Scope
from api.owner_calls import NotSent, ask
from api.problems import ApiProblem, answers
from api.seen import MAX_WAIT, WAITS, execution_out, mine, said_of, still
from executions import pipes
from executions.models import ENDED_STATES, Execution, State
from terminals.owner_client import owner_of_execution
from terminals.protocol import MAX_INTEGER, Peek

log = logging.getLogger(__name__)
router = Router(tags=["executions"])

READ_BYTES = 64 * 1024  # the most one output read returns (ask again from ``next``)
STREAMS = (
    "A command on pipes (`pty: false`): `stdout`, `stderr`, or `all` (both, in the order they came); `since` "
    "and the answer's offsets count in that stream. A command on a terminal has only `all`"
)


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
    view = view_of(await db(mine)(request, pk), stream)
    wait = min(wait, settings.TETHER_API_MAX_WAIT_SECONDS)
    return await read_output(lambda: _still_mine(request, pk), since, size, wait, f"api:{token.pk}", view)


def _still_mine(request, pk: int) -> Execution:
    still(request)
    return mine(request, pk)


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
    view = view_of(await db(mine)(request, pk), stream)
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
