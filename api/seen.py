"""What an API token sees of executions, and how each is said: only its user's own commands and shells, on
machines it still reaches; each one as ``ExecutionOut``, with why it ended when not by its own exit, and what
one not final awaits. Shared by the routes (executions, output, input, terminals) and the MCP tools."""

from __future__ import annotations

from enum import StrEnum

from django.db.models import OuterRef, Prefetch, Q, Subquery
from ninja import Field, Schema

from access.policy import Do, reach_of
from api.auth import usable
from api.models import ApiToken
from api.problems import ApiProblem
from executions.models import ENDED_STATES, FINAL_STATES, Evidence, Execution, ExecutionAlias, ExecutionEvent, State
from executions.presenters import execution_json

MAX_WAIT = 3600  # a bound on what is asked; how long a call waits at most is TETHER_API_MAX_WAIT_SECONDS
WAITS = "Seconds to wait: up to 3600 may be asked; a call waits at most TETHER_API_MAX_WAIT_SECONDS (60 by default)"


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


class Awaiting(StrEnum):
    """What an execution that is not final waits for (``NOTHING`` once it is)."""

    NOTHING = "nothing"
    START = "start"  # a worker to start it
    PROGRAM = "program"  # its program to end
    OPERATOR = "operator"  # its outcome is unknown: an operator resolves it


def said_of(execution: Execution) -> tuple[Awaiting, str]:
    """What it awaits, and the detail said with it: how it ended (and why, when not by its own exit)."""
    if execution.state in FINAL_STATES:
        why = why_of(execution)
        return Awaiting.NOTHING, f"{execution.outcome_label}: {why}" if why else execution.outcome_label
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


def mine(request, pk: int) -> Execution:
    execution = visible(request.auth).filter(pk=pk).first()
    if execution is None:
        raise ApiProblem("not_found", f"no execution {pk} of yours")
    return execution


AWAITING = {
    State.PENDING: (Awaiting.START, "it waits for a worker to start it"),
    State.DISPATCHED: (Awaiting.START, "a worker is starting it"),
    State.RUNNING: (Awaiting.PROGRAM, "it is still running"),
    State.UNKNOWN: (
        Awaiting.OPERATOR,
        "its outcome is unknown until an operator resolves it (the process may still be running); "
        "an await cannot end this by itself",
    ),
}
