"""Machines and executions: submit (idempotent by scope, id and spec), get, list, await, output by cursor,
cancel and resolve. Every check is the command line's: the same actions, the same refusals."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Annotated

from channels.db import database_sync_to_async as db
from django.conf import settings
from django.db import transaction
from django.db.models import Q
from ninja import Field, Query, Router, Schema, Status
from pydantic import StringConstraints

from access.fence import decided_again
from access.policy import Do, machine_named, may, reach_of
from api.auth import need
from api.models import Scope
from api.problems import ApiProblem, answers, field_error
from api.schemas import ABSOLUTE_PATH, ENV_NAME, MACHINE_NAME, NO_NUL, Body, Text
from api.seen import (
    AWAITING,
    MAX_WAIT,
    WAITS,
    ExecutionOut,
    execution_out,
    mine,
    namespace_of,
    said_of,
    still,
    visible,
)
from executions import actions as exec_actions
from executions.actions import Actor
from executions.actions.common import IDENTITY
from executions.errors import TransitionRefused
from executions.models import FINAL_STATES, Execution, State
from executions.spec import MAX_ARGV_BYTES, MAX_COLS, MAX_ROWS, ExecutionSpec, SpecError
from terminals.actions import request_process_action
from terminals.protocol import MAX_INTEGER
from terminals.resolution import resolve

log = logging.getLogger(__name__)
router = Router(tags=["executions"])

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


EnvName = Annotated[str, StringConstraints(min_length=1, max_length=4096, pattern=ENV_NAME)]
Identity = Annotated[str, StringConstraints(max_length=200, pattern=IDENTITY.pattern)]
MAX_ALIASES = 20  # given in one call


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
    execution = mine(request, pk)
    _, created = exec_actions.add_alias(
        execution, body.scope, body.id, namespace=namespace_of(token), actor=actor_of(token)
    )
    return Status(201 if created else 200, execution_out(mine(request, pk)))


@router.get("/executions/{pk}", **answers(ExecutionOut, "not_found"), summary="One execution")
def get_execution(request, pk: int):
    need(request, Scope.READ)
    return execution_out(mine(request, pk))


class AwaitOut(Schema):
    final: bool = Field(description="completed, cancelled or resolved: the record will not change again")
    awaiting: str = Field(description="nothing (final), start, program (it runs) or operator (unknown outcome)")
    detail: str
    execution: ExecutionOut


@router.get("/executions/{pk}/await", **answers(AwaitOut, "not_found"), summary="Wait (long poll) for a final state")
async def await_execution(request, pk: int, timeout: float = Query(30.0, ge=0, le=MAX_WAIT, description=WAITS)):
    await db(need)(request, Scope.READ)
    deadline = time.monotonic() + min(timeout, settings.TETHER_API_MAX_WAIT_SECONDS)
    while True:
        await db(still)(request)
        execution = await db(mine)(request, pk)
        if execution.state in FINAL_STATES:
            awaiting, detail = said_of(execution)
            return {"final": True, "awaiting": awaiting, "detail": detail, "execution": execution_out(execution)}
        if time.monotonic() >= deadline:
            awaiting, detail = AWAITING[execution.state]
            return {"final": False, "awaiting": awaiting, "detail": detail, "execution": execution_out(execution)}
        await asyncio.sleep(0.2)


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
    execution = mine(request, pk)
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
