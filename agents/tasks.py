"""MCP tasks (the protocol's experimental task-augmented calls) over Tether's executions: ``run_command``
called as a task answers at once with a task whose id names the execution (``execution-17``), and the task is
the execution: durable (it outlives the call, the client, the web process and the worker), read back by any
web process, and only ever its own user's.

Statuses: running or waiting to start is ``working``; an end the program's own exit (or a kill) settled
is ``completed`` (its result says the exit), one cancelled before it started ``cancelled``; an **unknown**
outcome is ``input_required``: neither completed nor failed, it waits for someone's input, an operator's, and
its ``statusMessage`` says what they must check. A resolved one is ``completed`` with a message saying its
exit stays unknown. Every task carries the execution's own state as ``tetherState``."""

from __future__ import annotations

from datetime import UTC, datetime

from channels.db import database_sync_to_async as db
from django.conf import settings
from mcp import types

from api import executions as api_executions
from api.models import Scope
from api.seen import AWAITING, Awaiting
from executions.models import ENDED_STATES, Execution, Kind, State

PREFIX = "execution-"
POLL_MS = 1000
LISTED = 50


def task_id(pk: int) -> str:
    return f"{PREFIX}{pk}"


def execution_of(call, task: str) -> Execution:
    """The caller's own execution a task id names; not_found (as for none) otherwise."""
    api_executions.need(call, Scope.READ)
    number = task.removeprefix(PREFIX)
    if not task.startswith(PREFIX) or not number.isascii() or not number.isdigit() or len(number) > 18:
        raise api_executions.ApiProblem("not_found", f"no task {task[:100]!r} of yours")
    return api_executions.mine(call, int(number))


def status_of(execution: Execution) -> tuple[str, str]:
    if execution.state == State.UNKNOWN:
        return "input_required", (
            "outcome unknown: its worker was lost and nobody saw how it ended (it may still run). An operator "
            f"must check machine {execution.machine.name} and resolve it; no exit code is made up."
        )
    if execution.state == State.RESOLVED:
        return "completed", "resolved by an operator: its exit code stays unknown (none is made up)"
    if execution.state == State.CANCELLED:
        return "cancelled", execution.outcome_label
    if execution.state in ENDED_STATES:
        return "completed", execution.outcome_label
    return "working", AWAITING[execution.state][1]


def task_of(execution: Execution) -> dict:
    status, message = status_of(execution)
    created = execution.created_at or datetime.now(UTC)
    updated = execution.ended_at or execution.resolved_at or execution.started_at or created
    return {
        "taskId": task_id(execution.pk),
        "status": status,
        "statusMessage": message,
        "createdAt": created,
        "lastUpdatedAt": updated,
        # The record outlives this (executions are not removed); the SDK's clients need a number (null is not sent).
        "ttl": settings.TETHER_RETENTION_HOURS * 3600 * 1000,
        "pollInterval": POLL_MS,
        "tetherState": execution.state,
    }


def register(lowlevel, serve, outcome, cancel) -> None:
    """Serve tasks/get, tasks/result, tasks/list and tasks/cancel on the SDK's ``lowlevel`` server.
    ``serve(name, work)``: runs ``work(call)`` for the request's caller (audited, a refusal said as its
    problem); ``outcome(call, pk, wait)``: a command's result; ``cancel(call, pk)``: as cancel_command."""
    features = lowlevel.experimental

    @features.get_task()
    async def get_task(request: types.GetTaskRequest) -> types.GetTaskResult:
        async def work(call):
            return types.GetTaskResult(**task_of(await db(execution_of)(call, request.params.taskId)))

        return await serve("tasks/get", work)

    @features.get_task_result()
    async def get_task_result(request: types.GetTaskPayloadRequest) -> types.GetTaskPayloadResult:
        async def work(call):
            execution = await db(execution_of)(call, request.params.taskId)
            # Waits for the end as long as an await may; an unknown outcome waits for an operator: said at once.
            wait = 0.0 if execution.state == State.UNKNOWN else float("inf")
            result = await outcome(call, execution.pk, wait)
            said = result.structuredContent
            if not said["final"] and said["awaiting"] != Awaiting.OPERATOR:  # a result is the task's last word
                text = f"{request.params.taskId} is still working ({said['detail']}): ask tasks/get, then tasks/result"
                raise api_executions.ApiProblem("state_conflict", text, state=said["execution"]["state"])
            return types.GetTaskPayloadResult(**result.model_dump(by_alias=True, exclude_none=True))

        return await serve("tasks/result", work)

    @features.list_tasks()
    async def list_tasks(request: types.ListTasksRequest) -> types.ListTasksResult:
        cursor = request.params.cursor if request.params else None

        def listed(call):
            """Your commands, newest first, a page at a time (the cursor: the last execution of the page before)."""
            api_executions.need(call, Scope.READ)
            commands = api_executions.visible(call.auth).filter(kind=Kind.COMMAND).order_by("-pk")
            if cursor:
                if not cursor.isascii() or not cursor.isdigit() or len(cursor) > 18:
                    raise api_executions.ApiProblem("invalid_request", "that cursor is not one tasks/list gave")
                commands = commands.filter(pk__lt=int(cursor))
            page = list(commands[: LISTED + 1])
            after = str(page[LISTED - 1].pk) if len(page) > LISTED else None
            return [task_of(e) for e in page[:LISTED]], after

        async def work(call):
            found, after = await db(listed)(call)
            return types.ListTasksResult(tasks=[types.Task(**task) for task in found], nextCursor=after)

        return await serve("tasks/list", work)

    @features.cancel_task()
    async def cancel_task(request: types.CancelTaskRequest) -> types.CancelTaskResult:
        async def work(call):
            execution = await db(execution_of)(call, request.params.taskId)
            await cancel(call, execution.pk)
            return types.CancelTaskResult(**task_of(await db(execution_of)(call, request.params.taskId)))

        return await serve("tasks/cancel", work)
