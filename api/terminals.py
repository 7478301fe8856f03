"""Terminal sessions over HTTP: open or reattach, state, output by offset, numbered input, resize, reset
and close. Only the session's own user reaches it here (watching another user's shell is the page's, where
its writer sees who watches)."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

from channels.db import database_sync_to_async as db
from django.conf import settings
from django.db.models import Prefetch, Q
from django.utils import timezone
from ninja import Field, Query, Router, Schema, Status

from access.policy import Do, machine_named, may
from api.auth import need
from api.executions import MACHINE_NAME, actor_of
from api.inputs import InputOut, NumberedIn, deliver
from api.models import Scope
from api.output import READ_BYTES, OutputOut, past_the_end, read_output, shaped
from api.owner_calls import NotSent, ask
from api.problems import ApiProblem, answers
from api.schemas import NO_NUL, Body
from api.seen import MAX_WAIT, WAITS, ExecutionOut, execution_out, namespace_of, still
from executions.models import ExecutionAlias
from terminals import actions
from terminals.actions.sessions import NoLongerAllowed
from terminals.models import ProcessState, TerminalSession
from terminals.owner_client import owner_of_execution
from terminals.protocol import MAX_COLS, MAX_INTEGER, MAX_ROWS, ApiResize, ErrorCode, Request

router = Router(tags=["terminals"])


class LastScreenOut(Schema):
    text: str = Field(description="The rows its page showed when its shell ended, blank rows at the end left out")
    exact: bool = Field(
        description="Drawn from every byte of its screen; false: from the output kept, rows drawn before may be missing"
    )


class TerminalOut(Schema):
    id: uuid.UUID
    machine: str
    generation: int = Field(description="Its shell's number: a reset or a fresh start begins the next")
    process_state: str = Field(description="live, closing or closed (as the page says)")
    snapshot_kind: str = Field(description="live, or archived once closed")
    close_reason: str = Field(description="Why its shell closed (exited, killed, idle, reset, ...); empty while live")
    outcome: str = Field(description="How its current shell ended, in the page's words ('unknown' stays unknown)")
    ends_with_worker: str = Field(description="Why its shell would end with its worker; empty when it survives it")
    created_at: str
    closed_at: str | None
    last_screen: LastScreenOut | None = Field(
        description="Once closed: its shell's last screen, as text (null while live, once dismissed or removed by "
        "retention, or when none was rendered)"
    )
    execution: ExecutionOut


def last_screen_out(session: TerminalSession) -> dict | None:
    shown = session.process_state == ProcessState.CLOSED and not session.snapshot_hidden and not session.expired_at
    if not (shown and session.last_screen):
        return None
    return {"text": session.last_screen, "exact": session.last_screen_exact}


def terminal_out(session: TerminalSession) -> dict:
    lease = getattr(session.execution, "lease", None)
    return {
        "id": session.pk,
        "machine": session.machine.name,
        "generation": session.generation,
        "process_state": session.process_state,
        "snapshot_kind": session.snapshot_kind,
        "close_reason": session.close_reason,
        "outcome": session.execution.outcome_label,
        "ends_with_worker": lease.ends_with_worker if lease and lease.released_at is None else "",
        "created_at": session.created_at.isoformat(),
        "closed_at": session.closed_at.isoformat() if session.closed_at else None,
        "last_screen": last_screen_out(session),
        "execution": execution_out(session.execution),
    }


def _session(request, session_id: uuid.UUID) -> TerminalSession:
    """The token's user's own session, while the token may still use its machine; else 404 as for none. A
    session closed longer ago than the retention period is 410, with when it was removed."""
    session = (
        TerminalSession.objects.select_related("machine", "execution__machine", "execution__resolved_by", "user")
        .prefetch_related(_aliases(request.auth))
        .filter(pk=session_id, user=request.auth.user)
        .first()
    )
    if session is None or not may(request.auth, Do.USE, session):
        raise ApiProblem("not_found", f"no terminal session {session_id} of yours")
    if (removed := removed_at(session)) is not None:
        raise ApiProblem(
            "gone",
            f"terminal session {session_id} closed at {session.closed_at.isoformat()}; what it kept was removed at "
            f"{removed.isoformat()} (closed sessions are kept {settings.TETHER_RETENTION_HOURS} h)",
            removed_at=removed.isoformat(),
            closed_at=session.closed_at.isoformat(),
        )
    return session


def _aliases(token) -> Prefetch:
    """The aliases the token's user gave its executions, never another person's."""
    return Prefetch("execution__aliases", queryset=ExecutionAlias.objects.filter(namespace=namespace_of(token)))


def removed_at(session: TerminalSession) -> datetime | None:
    """When a closed session's output was removed (or is due to be: the cleanup runs every few minutes, and
    the answer does not wait for it); None while it is kept."""
    if session.process_state != ProcessState.CLOSED or session.closed_at is None:
        return None
    due = session.closed_at + timedelta(hours=settings.TETHER_RETENTION_HOURS)
    if session.expired_at is not None:
        return session.expired_at
    return due if due <= timezone.now() else None


@router.get("", **answers(list[TerminalOut]), summary="Your terminal sessions, newest first")
def list_terminals(request, limit: int = Query(50, ge=1, le=200)):
    token = need(request, Scope.TERMINALS)
    sessions = TerminalSession.objects.select_related("machine", "execution__machine", "execution__resolved_by")
    mine = sessions.filter(user=request.auth.user).order_by("-created_at").prefetch_related(_aliases(token))
    past = timezone.now() - timedelta(hours=settings.TETHER_RETENTION_HOURS)  # those answer 410 now
    gone = Q(process_state=ProcessState.CLOSED) & (Q(expired_at__isnull=False) | Q(closed_at__lte=past))
    return [terminal_out(s) for s in mine.exclude(gone)[: limit * 2] if may(token, Do.USE, s)][:limit]


class OpenIn(Body):
    machine: str = Field(max_length=100, pattern=MACHINE_NAME)


class OpenOut(Schema):
    created: bool = Field(description="False: the machine's open session was reattached")
    terminal: TerminalOut


@router.post(
    "",
    **answers({200: OpenOut, 201: OpenOut}, "not_found", "forbidden", "slot_taken", "state_conflict"),
    summary="Open a shell, or reattach to the open one",
)
def open_terminal(request, body: OpenIn):
    token = need(request, Scope.TERMINALS)
    user = request.auth.user
    machine = machine_named(token, body.machine, Do.USE)  # the same work for a name nothing carries
    if machine is None:
        raise ApiProblem("not_found", f"no machine {body.machine!r} you may use")
    try:
        session, created = actions.open_terminal(machine, user, token=token)
    except NoLongerAllowed:  # lost while it was on its way: as for a machine that is not there
        raise ApiProblem("not_found", f"no machine {body.machine!r} you may use") from None
    if session.user_id != user.pk:  # another user's open shell (watching it is the page's, where they see you)
        raise ApiProblem("forbidden", f"{machine.name} has another user's shell open")
    opened = {"created": created, "terminal": terminal_out(_session(request, session.pk))}
    return Status(201 if created else 200, opened)


@router.get("/{session_id}", **answers(TerminalOut, "not_found", "gone"), summary="A session's state")
def terminal_state(request, session_id: uuid.UUID):
    need(request, Scope.TERMINALS)
    return terminal_out(_session(request, session_id))


@router.get(
    "/{session_id}/output",
    **answers(OutputOut, "not_found", "gone", "offset_out_of_range", "owner_unavailable"),
    summary="A shell's output by byte offset",
)
async def terminal_output(
    request,
    session_id: uuid.UUID,
    since: int = Query(0, ge=0, le=MAX_INTEGER),
    generation: int | None = Query(None, ge=1, description="The generation your `since` counts in"),
    epoch: int | None = Query(None, ge=0, description="The epoch your `since` counts in (from the last read)"),
    size: int = Query(READ_BYTES, ge=1, le=READ_BYTES),
    wait: float = Query(0.0, ge=0, le=MAX_WAIT, description=WAITS),
):
    """Offsets count within one shell (its `generation`) and one owner's stream (its `epoch`), except that a
    held shell's offsets are the same for every owner. When yours no longer count (a reset, an adoption of a
    tmux shell) the answer says `restarted` and reads from the start of the stream as it is now."""
    token = await db(need)(request, Scope.TERMINALS)
    session = await db(_session)(request, session_id)
    if session.process_state == ProcessState.CLOSED:
        return closed_output(session, since, size)
    wait = min(wait, settings.TETHER_API_MAX_WAIT_SECONDS)

    def load():
        still(request)
        return _session(request, session_id).execution

    try:
        answer = await read_output(load, since, size, wait, f"api:{token.pk}")
    except ApiProblem as problem:  # past the end: of this stream, or of one that started again since
        # (The record's own past-the-end names no generation: it is the session's, which ended meanwhile.)
        where = {"generation": session.generation, **problem.extra}
        if problem.code != "offset_out_of_range" or not _moved(where, generation, epoch):
            raise
        answer = where
    if since and _moved(answer, generation, epoch) and (answer.get("epoch") or "data" not in answer):
        answer = await read_output(load, 0, size, 0.0, f"api:{token.pk}")
        answer["restarted"] = True
    return answer


def _moved(answer: dict, generation: int | None, epoch: int | None) -> bool:
    """Whether offsets counted in ``generation`` and ``epoch`` (the asker's) no longer count in the stream
    ``answer`` read (a live one: a held shell's offsets are the same for every owner)."""
    if generation is not None and generation != answer.get("generation"):
        return True
    return epoch is not None and epoch != answer.get("epoch") and not answer.get("offsets_survive_owner", True)


def closed_output(session: TerminalSession, since: int, size: int) -> dict:
    """A closed shell's output: the final tail it left (its snapshot, ending at its last offset), the bytes
    before it counted as gone (until retention removes the tail too)."""
    end = session.output_offset
    if since > end:
        raise past_the_end(since, end, generation=session.generation)
    tail = bytes(session.snapshot or b"")
    first = end - len(tail)
    start = max(since, first)
    data = tail[start - first : start - first + size]
    return shaped(data, start, start + len(data), first, max(first - since, 0), end, final=start + len(data) >= end,
                  source="record", state=session.execution.state, generation=session.generation)  # fmt: skip


class InputIn(NumberedIn):
    """Keys for the shell."""


@router.post(
    "/{session_id}/input",
    **answers(
        InputOut,
        "not_found",
        "gone",
        "state_conflict",
        "input_unconfirmed",
        "input_gap",
        "input_conflict",
        "not_writer",
        "owner_unavailable",
    ),
    summary="Type into the shell (numbered, written once)",
)
async def terminal_input(request, session_id: uuid.UUID, body: InputIn):
    token = await db(need)(request, Scope.TERMINALS)
    session = await db(_session)(request, session_id)
    data = body.bytes()
    if session.process_state != ProcessState.LIVE:
        raise ApiProblem("state_conflict", f"the session is {session.process_state}: its shell takes no input")
    owner = await db(owner_of_execution)(session.execution_id)
    return await deliver(token, {"session": session}, owner, body.seq, body.client, data, "the shell")


class ResizeIn(Body):
    cols: int = Field(..., ge=1, le=MAX_COLS)
    rows: int = Field(..., ge=1, le=MAX_ROWS)


@router.post(
    "/{session_id}/resize",
    **answers(TerminalOut, "not_found", "gone", "state_conflict", "not_writer", "owner_unavailable"),
    summary="Set the shell's grid",
)
async def terminal_resize(request, session_id: uuid.UUID, body: ResizeIn):
    token = await db(need)(request, Scope.TERMINALS)
    session = await db(_session)(request, session_id)
    if session.process_state != ProcessState.LIVE:
        raise ApiProblem("state_conflict", f"the session is {session.process_state}")
    owner = await db(owner_of_execution)(session.execution_id)
    answer = None
    try:
        if owner:
            answer = await ask(owner, ApiResize, viewer=f"api:{token.pk}", cols=body.cols, rows=body.rows)
    except NotSent:
        pass
    if answer is None:
        raise ApiProblem("owner_unavailable", "no worker holds the shell right now; try again", retry_after=1)
    if not answer.get("ok"):
        code = "not_writer" if answer.get("code") == ErrorCode.NOT_WRITER else "owner_unavailable"
        raise ApiProblem(code, answer.get("text", ""), **({"retry_after": 1} if code == "owner_unavailable" else {}))
    return await db(lambda: terminal_out(_session(request, session_id)))()


class ReasonIn(Body):
    reason: str = Field("", max_length=500, pattern=NO_NUL)


def _ask_owner_to(request, session_id, action: str, reason: str) -> dict:
    token = need(request, Scope.TERMINALS)
    session = _session(request, session_id)
    actions.operator_session_action(session, action, actor=actor_of(token), reason=reason or f"{action} (API)")
    return terminal_out(_session(request, session_id))


@router.post(
    "/{session_id}/reset",
    **answers({202: TerminalOut}, "not_found", "gone", "state_conflict"),
    summary="End the shell and start a fresh one",
)
def terminal_reset(request, session_id: uuid.UUID, body: ReasonIn):
    """Its owner ends the shell (its outcome recorded as it is known) and starts the next generation."""
    return Status(202, _ask_owner_to(request, session_id, Request.RESET, body.reason))


@router.post(
    "/{session_id}/close", **answers({202: TerminalOut}, "not_found", "gone", "state_conflict"), summary="End the shell"
)
def terminal_close(request, session_id: uuid.UUID, body: ReasonIn):
    """Its owner ends the shell; the session closes with its outcome (read the state until it is closed)."""
    return Status(202, _ask_owner_to(request, session_id, Request.COMPLETE, body.reason))
